"""The benchmark scripts under benchmarks/ (their tallies, not their timings)."""
