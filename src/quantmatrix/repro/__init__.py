"""`quantmatrix repro`: a red cell as a bundle a vLLM developer runs without quantmatrix (docs/repro.md)."""
