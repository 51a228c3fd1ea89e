"""Part 2: a tiny decoder-only transformer with a KV cache (``transformer_skeleton.py``).

The folder's layout is described in :mod:`grader.parts`."""
