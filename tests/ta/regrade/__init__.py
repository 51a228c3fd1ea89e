"""Regrading a class: batch, cluster, merge."""
