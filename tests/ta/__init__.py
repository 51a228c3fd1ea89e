"""TA tooling: regeneration, skeletons, zips, calibration, mutants."""
