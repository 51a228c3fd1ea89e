"""Part 1: the calculator."""
