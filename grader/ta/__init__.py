"""TA tooling, never part of a grading: regenerating cases and skeletons, the zips, the
local Gradescope run, calibration, the mutant library and mutation runs, and regrading a
class (``grader.ta.regrade``)."""
