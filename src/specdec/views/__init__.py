"""Views of a generation's trace: the terminal (live and replayed) and a self-contained HTML page."""
