"""Checkpoints of the matrix's cells: the synthetic factory (`store` assembles one from the family `base`, a
`schemes` module, a `producers` module, `faults` and `configs`), the content-addressed cache and hub store, the lint,
and `fetch` for a runner's HF cache."""
