"""`quantmatrix repro`: a red cell as a bundle a vLLM developer runs without quantmatrix (docs/repro.md)."""

# bytes of checkpoint files a bundle carries; above it, the recipe only (here, so the CLI states the default
# without importing the bundle writer, which imports torch)
CHECKPOINT_CAP = 64 << 20
