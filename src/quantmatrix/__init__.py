"""quantmatrix: a cross-hardware regression suite for quantized MoE checkpoints served by vLLM.

Data flows one way, and the packages follow it (`errors`, `atomic` and `properties`, the JUnit property names,
are shared by all):

    schema       YAML matrix -> cells (checkpoint x arch x mode) -> cases (a check on a cell)
    host         this machine's GPUs, detected without a CUDA context in the pytest process
    adapter      every vLLM-version-specific name: config resolution, MoE layers, the capability simulation
    checkpoints  synthetic factory, cache and hub store, NVFP4 numerics, lint, fetch
    engine       isolated vLLM engine runs (runner, child, poison plugin, references)
    measure      measurements, never verdicts: the sentinel audit, observed reads, dequantized logits, transformers
    checks       verdicts (one Verdict style): dispatch, audit, kernel format, checkpoint, quality, e2e
    pytest_plugin  cases as pytest items, fixtures, the judge, JUnit properties
    report       nightly JUnit merge -> diff -> summary.json, matrix.md, index.html
    cli          the `quantmatrix` command
"""

__version__ = "0.1.0"
