"""Graded checks, one module per part (``part1`` ...), run by :mod:`grader.runner`."""
