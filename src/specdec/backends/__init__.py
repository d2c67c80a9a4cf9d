"""Model runtimes behind the one seam of :mod:`specdec.backends.base`, one per file."""
