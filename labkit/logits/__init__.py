"""`labkit logits-check`: teacher-forced, row-by-row logits comparison (suites, collectors, compare)."""
