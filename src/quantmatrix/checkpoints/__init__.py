"""Checkpoints of the matrix's cells: the synthetic factory (configs, base, export), the content-addressed cache
and hub store, reference NVFP4 numerics, the lint, and `fetch` for a runner's HF cache."""
