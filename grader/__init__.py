"""Autograder and TA tooling for the KV-cache course kit (``python -m grader``)."""
