"""`quantmatrix bisect`: the release (and per-commit build) where one case's verdict changed."""
