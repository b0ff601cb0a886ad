"""Acceptance suites: one test module per area; checks.py is the vocabulary they share."""
