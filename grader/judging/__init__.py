"""What the parts' checks share: the graded test-case base classes, logit comparison, the
timed prompt pools and images for feedback. Above the runtime, below the parts."""
