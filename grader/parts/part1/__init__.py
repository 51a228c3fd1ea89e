"""Part 1: the KV-cache calculator (``question1.py``).

The folder's layout is described in :mod:`grader.parts`."""
