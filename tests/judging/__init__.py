"""Shared check helpers: logit comparison, timed pools."""
