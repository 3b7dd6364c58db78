"""Thin on purpose: the quantmatrix plugin (a pytest11 entry point) does the work, so `pytest -m sm120` behaves
the same from any checkout. Run output and benchmarks are never collected."""

collect_ignore = ["reports", "bench"]
