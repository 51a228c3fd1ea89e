"""Part 4: the KV-cache lab on small GPT-2 models (``kv_lab.py``).

The folder's layout is described in :mod:`grader.parts`."""
