"""The bottom layer: plain data and pure functions every other layer may use (the parts'
registry, points, results, reports, thresholds, the array codec, the project's paths).
Imports nothing of the grader above it."""
