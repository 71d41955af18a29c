"""Traced cases: case files (cases.py), the event log (events.py), checking a log against a case and the
invariants (validate.py), readable views (tables.py), the run (run.py), Perfetto export (perfetto.py)."""
