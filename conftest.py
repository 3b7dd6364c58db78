"""Thin on purpose: the quantmatrix plugin (a pytest11 entry point) does the work, so `pytest -m sm120` behaves
the same from any checkout. Run output and benchmarks are never collected."""

from importlib.metadata import entry_points

collect_ignore = ["reports", "bench"]

# An editable install made before the e2e plugin's entry point existed has metadata without it: load it from
# here in that case only (loading it twice would be a pytest error).
if not any(ep.name == "quantmatrix_e2e" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["quantmatrix.e2e_plugin"]
