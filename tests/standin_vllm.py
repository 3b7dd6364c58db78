"""A stand-in vLLM for quantmatrix's own tests of a night (tests/test_crossarch_plugin.py,
tests/nightly_sim.py): vLLM's CPU engine costs ~25 s a start here, so a fake `vllm` package on the
runs' PYTHONPATH implements exactly the surface the engine child uses (`vllm.LLM(model=..., **engine_args)`,
`.generate(prompts, SamplingParams, use_tqdm=False)`, `.apply_model(fn)`, RequestOutputs with `prompt_token_ids`
and `outputs[0].text / token_ids / logprobs`, and the loader module the poison seam wraps); every other `vllm.*`
module the health check imports (adapter.health.PARTS) is an empty package. Its greedy tokens depend on the arch's
`engine_args` (`fake_kernel`), as a real kernel's numerics depend on the arch: `reference`; `near_tie` picks the
reference's second choice at one position of prompt 0 (a flip within each other's top-k); `outside` picks a token
the reference never ranked (what an arch-dependent bug does); `degenerate` repeats one token (the seed bug).
Installed `broken`, its quantization package raises at import, as the nightly wheel's whose flashinfer trips over
its CUDA bindings does.
"""

from __future__ import annotations

from pathlib import Path

from quantmatrix.adapter.health import PARTS

FAKE_VLLM = '''
"""A stand-in vLLM for quantmatrix's tests (tests/test_crossarch_plugin.py): no model, deterministic tokens."""
RANKS = 4  # alternatives after the greedy choice: a token at rank 2 is 100 above it, rank 3 200 above, ...


class Logprob:
    def __init__(self, logprob):
        self.logprob = logprob


class SamplingParams:
    def __init__(self, temperature=1.0, max_tokens=16, logprobs=None, ignore_eos=False):
        self.max_tokens, self.logprobs = max_tokens, logprobs


class _Completion:
    def __init__(self, token_ids, logprobs):
        self.token_ids, self.logprobs = token_ids, logprobs
        self.text = "".join(f" t{t}" for t in token_ids)


class RequestOutput:
    def __init__(self, prompt_token_ids, completion):
        self.prompt_token_ids, self.outputs = prompt_token_ids, [completion]


def _step(prompt, position, kernel, k):
    """(greedy token, its ranked top-k) at one position of one prompt, on this kernel."""
    ref = 1000 + 10 * prompt + position
    ranked = [ref + 100 * r for r in range(RANKS + 1)]
    if kernel == "degenerate":  # one token over and over: what the seed bug's zeroed experts emit
        ranked = [5 + 100 * r for r in range(RANKS + 1)]
    if prompt == 0 and position >= 2 and kernel != "reference":
        if position == 2 and kernel == "near_tie":  # the reference's runner-up wins here: a near-tie flip
            ranked = [ranked[1], ranked[0], *ranked[2:]]
        else:  # after the parting (or, for `outside`, at it) this kernel continues on its own tokens
            ranked = [7000 + position + 100 * r for r in range(RANKS + 1)]
    return ranked[0], {t: Logprob(-0.5 * r - 0.1) for r, t in enumerate(ranked[:k])}


class _Model:
    def named_modules(self):
        return iter(())


class LLM:
    def __init__(self, model, **engine_args):
        self.kernel = engine_args.get("fake_kernel", "reference")

    def generate(self, prompts, params, use_tqdm=True):
        out = []
        for p, _ in enumerate(prompts):
            steps = [_step(p, j, self.kernel, params.logprobs) for j in range(params.max_tokens)]
            out.append(RequestOutput([1, 2, 3 + p], _Completion([t for t, _ in steps], [lp for _, lp in steps])))
        return out

    def apply_model(self, fn):
        return [fn(_Model())]


'''
# The modules the health check imports (adapter.health.PARTS) are empty packages of the stand-in, except these.
MODULES = {"vllm.model_executor.model_loader.base_loader": "initialize_model = process_weights_after_loading = "
                                                            "lambda *args, **kwargs: None\n",
           "vllm.model_executor.layers.quantization": "get_quantization_config = lambda method: object\n",
           # as vLLM's does (vllm/entrypoints/llm.py): a quantization package that cannot import breaks the engine
           "vllm.entrypoints.llm": "import vllm.model_executor.layers.quantization  # noqa: F401\n"}


# The matrix of a night over two archs (tests/nightly_sim.py, tests/test_crossarch_plugin.py): one e2e check on
# bf16 checkpoints served by this stand-in, whose tokens follow each arch's `fake_kernel` (KERNEL: sm121's, set
# per run). TESTS is its suite.
_TWO_ARCHS = """\
version: 1
archs:
  - {name: sm120, capability: "12.0", aliases: [rtx_pro_6000], label: RTX PRO 6000,
     engine_args: {fake_kernel: reference}}
  - {name: sm121, capability: "12.1", aliases: [gb10], label: GB10, engine_args: {fake_kernel: KERNEL}}
modes:
  - {name: default, label: default}
schemes:
  - name: bf16
    marker: bf16
    label: bf16
    expect:
      degeneration: {max_repeat_run: 4, min_distinct_1: 0.5, min_distinct_2: 0.5, max_compression_ratio: 6}
      degenerate: false
      agreement_top_k: 3
checks:
  - {name: degeneration, kind: e2e, tier: gpu, vllm: [engine], description: greedy output is not degenerate}
checkpoints:
CHECKPOINTS
e2e:
  prompts: prompts.txt
  references: refs
  max_tokens: 6
  logprobs: 5
  timeout_s: 120
  reference_mode: default
"""
TESTS = """\
from quantmatrix.checks import e2e as verdicts

def test_degeneration(case, engine_run, judge):
    judge(verdicts.degeneration, case, engine_run)
"""


def two_arch_matrix(*checkpoints: str) -> str:
    """The two-arch matrix with these bf16 checkpoint ids (each from the project's `ck` directory)."""
    lines = [f"  - {{id: {ck}, source: {{path: ck}}, producer: none, scheme: bf16}}" for ck in checkpoints]
    return _TWO_ARCHS.replace("CHECKPOINTS", "\n".join(lines))


BROKEN = {"vllm.model_executor.layers.quantization":
          "raise AttributeError(\"module 'cuda.bindings.runtime' has no attribute 'cudaLibrary_t'\")\n"}


def install(site: Path, broken: bool = False) -> Path:
    """The stand-in vLLM as a package tree under `site` (put it first on the runs' PYTHONPATH)."""
    modules = {**MODULES, **(BROKEN if broken else {})}
    for module in {m for names in PARTS.values() for m in names} | set(modules):
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            (site.joinpath(*parts[:i])).mkdir(parents=True, exist_ok=True)
            (site.joinpath(*parts[:i]) / "__init__.py").write_text(modules.get(".".join(parts[:i]), ""))
    (site / "vllm" / "__init__.py").write_text(FAKE_VLLM)
    return site
