"""The assignment's parts, one folder each (``grader/parts/<tag>/``):

- ``checks.py`` (with ``support.py``, ``timed.py``, ``diagnosis.py`` where the part needs
  them): the part's checks, trusted, run in the grader;
- ``cases.py``: the constants and seeded data both the checks and the builder use;
- ``build.py`` (and ``build_*.py``): builds the part's test cases and diagnosis catalogue
  from ``solution/`` (``python -m grader regen``); TA-side only, so no grading path imports
  it and the autograder zip leaves it out;
- ``adapter.py`` (and ``adapter_*.py`` beside it): the worker side, the only files that
  touch student code. They are copied into each sandbox as ``adapter_<tag>.py`` (and
  ``adapter_<tag>_*.py``) and import nothing of the grader.

A part may hold more modules of its own (Part 1's ``seal.py``: the write-up answers sealed
in the public cases students get). The parts never import each other; what they share is
in the layers below (``grader.judging``, ``grader.runtime``, ``grader.core``). Which part
needs which file, and where its checks are, is in :mod:`grader.core.registry`; its mutant
library (known mistakes and correct variants) is TA tooling, in ``grader/ta/mutants/``.
"""
