"""Part 3: KV caching in the Llama 3 reference code (``llama/model.py``, ``llama/generation.py``).

The folder's layout is described in :mod:`grader.parts`."""
