"""Draft-length policies: how many draft tokens to verify in each target forward, one per file."""
