"""Traced cases: case files (cases.py) and event-log checking (validate.py)."""
