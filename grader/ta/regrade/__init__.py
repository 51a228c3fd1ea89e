"""Regrading a Gradescope export: one submission (``one``), a class on this machine or a
Slurm cluster (``batch``, ``cluster``), merging CPU and GPU scores (``merge``), and the
summary a TA reads (``report``)."""
