"""Part 2: the tiny transformer."""
