"""The bottom layer: registry, points, results, thresholds."""
