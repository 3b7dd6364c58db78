"""What a repro script runs: one observer per check, each the check's own measurement (adapter/, measure/) and
its own judgement (checks/) of the bundle's checkpoint, with the matrix's expectations carried as plain data in
CASE. These functions are lifted into the script (repro.lift), so they call only what can be lifted and read
nothing of quantmatrix's own files; `run` is the script's main.

An observer returns (problem, observed): the check's failure message without its heading (None: the check would
pass here, the bug is gone) and what it measured, for the reader and for `--json`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantmatrix.adapter import config, kernel, layers
from quantmatrix.adapter.versions import versions
from quantmatrix.checkpoints import base, lint
from quantmatrix.checks import audit, checkpoint, dispatch, hardware
from quantmatrix.checks.kernel import kernel_problem
from quantmatrix.checks.observed_reads import observed_problem
from quantmatrix.errors import QuantmatrixError
from quantmatrix.host.probe import Seen, _allocate
from quantmatrix.measure import dequant, observed, sentinel
from quantmatrix.measure.hf import HfGreedy
from quantmatrix.schema.model import MoeBackend, TensorFinding

Observed = tuple[str | None, dict[str, Any]]
FIXED, FOUND, CANNOT = 0, 1, 2  # the script's exit codes


class Unobservable(Exception):
    """This host cannot show the observation at all (no GPU, a conversion that needs CUDA, a mode that needs
    quantmatrix's own engine plugin): neither fixed nor still broken."""


def run(case: dict[str, Any], observe: Callable[[dict[str, Any], dict[str, Path]], Observed], script: Path,
        argv: list[str]) -> int:
    """The script's main: 0 the check passes here (the bug is fixed), 1 it fails as it did, 2 not observable."""
    import argparse

    p = argparse.ArgumentParser(description=f"{case['heading']}: {case['title']}")
    p.add_argument("--checkpoint", type=Path, help="the checkpoint directory (default: the bundle's checkpoint/)")
    p.add_argument("--json", action="store_true", help="print what was observed as JSON on the last line")
    p.add_argument("--allocate", action="store_true", help=argparse.SUPPRESS)  # device_identity's child
    args = p.parse_args(argv)
    if args.allocate:
        print(json.dumps(_allocate()))
        return FIXED
    os.environ.update(case["env"])  # before vLLM is imported: the platform's and the mode's settings
    here = script.resolve().parent
    where = {"script": script.resolve(), "checkpoint": args.checkpoint or here / "checkpoint", "base": here / "base"}
    if not (where["checkpoint"] / "config.json").is_file():
        print(f"no checkpoint at {where['checkpoint']}: {case['checkpoint']['how']}")
        return CANNOT
    print(f"{case['heading']}: {case['title']}\nunder test here: {json.dumps(versions())}", flush=True)
    try:
        problem, observed = observe(case, where)
    except (Unobservable, QuantmatrixError) as e:
        print(f"cannot observe this here ({type(e).__name__}): {e}")
        return CANNOT
    for key, value in observed.items():
        shown = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        night = case["recorded"].get(key)
        print(f"  {key}: {shown[:2000]}" + (f"   (the failing run recorded: {night[:2000]})"
                                             if night not in (None, shown) else ""))
    if problem is None:
        print(f"PASS: the check passes here; the failure below is gone:\n  {case['message'][:2000]}")
    else:
        print(f"FAIL {case['heading']}: {problem}")
    if args.json:
        print(json.dumps({"problem": problem, "observed": observed}, default=str))
    return FIXED if problem is None else FOUND


# ------------------------------------------------------------------------------------------- helpers


def backends_of(case: dict[str, Any]) -> dict[str, MoeBackend]:
    return {name: MoeBackend(name, frozenset(b["reads"]), b["single_input_scale"], b["label"], b["kernel_alphas"])
            for name, b in case["expected"]["backends"].items()}


def findings_of(items: list[Any]) -> tuple[str | TensorFinding, ...]:
    return tuple(i if isinstance(i, str) else TensorFinding(i["code"], i["tensor"]) for i in items)


def capability(case: dict[str, Any]) -> tuple[int, int]:
    return int(case["arch"]["capability"][0]), int(case["arch"]["capability"][1])


def layer_facts(build: layers.LayerBuild) -> dict[str, Any]:
    layer = build.layer
    return {"moe_method": layer.method if layer else "", "moe_backend": layer.backend if layer else "",
            "moe_weight_only": str(layer.weight_only).lower() if layer else "",
            "layer_build_error": build.error or "", "simulated_without": ",".join(build.simulated_without)}


# ----------------------------------------------------------------------------------------- observers


def observe_config_dispatch(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """vLLM's config resolution of the checkpoint (ModelConfig -> get_quant_config -> from_config)."""
    e = case["expected"]
    got = config.resolve(where["checkpoint"])
    shape = dispatch.config_shape(where["checkpoint"])
    settled = got.scheme == e["resolves_to"]
    because = e.get("rejected_because") if settled else None
    # Python's re, not the check's RE2 (not a vLLM dependency): the pattern already compiled under RE2 when the
    # matrix was loaded, so it has no construct re reads differently, and it is searched in vLLM's own message
    matched = because is not None and re.search(because, got.detail) is not None
    problem = dispatch.config_problem(e["resolves_to"], e.get("quant_method") if settled else None, because,
                                      matched, got, shape)
    return problem, {"config_shape": shape, "quant_method": got.method, "quant_config_class": got.config_class,
                     "resolved_algo": got.algo, "resolved_scheme": got.scheme, "detail": got.detail}


def observe_layer_dispatch(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """vLLM's own MoE block built for the checkpoint as on the cell's arch (its capability simulated)."""
    e = case["expected"]
    build = layers.build(where["checkpoint"], capability(case))
    problem = dispatch.layer_problem(e["resolves_to"], e.get("activation_scales"), e.get("moe_backend"),
                                     f"on {case['arch']['describe']}", build, backends_of(case))
    return problem, layer_facts(build)


def observe_post_load_audit(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """Every MoE layer filled with a sentinel, loaded through vLLM's weight loaders, twice: what stayed unloaded."""
    e = case["expected"]
    build = layers.build(where["checkpoint"], capability(case), every_layer=True)
    if build.layer is None and e["resolves_to"] == "rejected":
        return None, {"skipped": "vLLM refuses this config, as the matrix expects: there is no layer to audit"}
    backends = backends_of(case)
    report = None
    if build.layer is not None and build.layer.backend in backends:
        b = backends[build.layer.backend]
        report = sentinel.audit(build.layers, sentinel.checkpoint_tensors(where["checkpoint"]), b.reads,
                                b.single_input_scale)
    problem = audit.audit_problem(build, backends, report, e["cell_words"], e["resolves_to"] == "weight_only",
                                  findings_of(e.get("audit", [])))
    found = [f.describe() for f in report.findings] if report is not None else []
    return problem, {**layer_facts(build), "findings": found}


def observe_kernel_format(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """A freshly loaded layer through vLLM's process_weights_after_loading and its fused-MoE quant config."""
    e = case["expected"]
    build = layers.build(where["checkpoint"], capability(case))
    if build.layer is None and e["resolves_to"] == "rejected":
        return None, {"skipped": "vLLM refuses this config, as the matrix expects: there is no layer to convert"}
    kf = None
    if build.layer is not None:
        build.layer.load(sentinel.checkpoint_tensors(where["checkpoint"], build.layer.prefix)())
        kf = kernel.kernel_format(build.layer)
        if kf.needs_cuda:
            raise Unobservable(kf.needs_cuda)
    problem = kernel_problem(build, backends_of(case), kf, case["arch"]["describe"],
                             e.get("activation_scales") or "any")
    facts = {"quant_config": kf.quant_config, "alphas": kf.alphas,
             "activation_scales_kept": ",".join(kf.activation_scales)} if kf is not None else {}
    return problem, {**layer_facts(build), **facts}


def observe_checkpoint_lint(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """The tensors in the checkpoint's files against the scheme its config declares (read as vLLM reads it)."""
    report = lint.lint(where["checkpoint"], block_scales=True)
    problem = checkpoint.lint_problem(findings_of(case["expected"]["lint"]), report)
    return problem, {"lint_declared": f"{report.declared.producer} {report.declared.scheme}",
                     "lint_findings": [f"{f.code}: {f.name}" for f in report.findings]}


def observe_hf_reference(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """transformers loads the bf16 checkpoint from its files and continues the prompts greedily, against the
    continuation of the same weights built in memory when the bundle was made."""
    e = case["expected"]
    ids = base.encode(where["checkpoint"], e["prompts"])
    agrees = ids == e["prompt_ids"]
    from_files = base.greedy(base.load_hf(where["checkpoint"]), ids) if agrees else []
    greedy = HfGreedy(e["prompts"], agrees, from_files, e["in_memory"] if agrees else [])
    return checkpoint.hf_problem(greedy), {"hf_greedy_token_ids": json.dumps(from_files)}


def observe_dequant_logits(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """The model the files decode to (vLLM's dequantization / unpacking) against the bf16 model it came from
    (base/)."""
    if not (where["base"] / "config.json").is_file():
        raise Unobservable(f"the bf16 model this checkpoint was quantized from is not at {where['base']}")
    err = dequant.dequant_error(dequant.dequantized_state(where["checkpoint"]), where["base"],
                                case["expected"]["prompts"])
    strays = case["expected"].get("dequant_strays", False)
    return checkpoint.dequant_problem(err, strays), {"logit_rel_error": round(err.rel_error, 5),
                                             "top1_agreement": round(err.top1, 4)}


def observe_device_identity(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """What cuda:0 of a child process with the mode's environment is, and whether its allocator caches."""
    import subprocess
    import sys

    env = {**os.environ, **case["mode"]["env"]}
    proc = subprocess.run([sys.executable, str(where["script"]), "--allocate"], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise Unobservable(f"no CUDA device answered here: {proc.stderr.strip().splitlines()[-1:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    seen = Seen(data["name"], tuple(data["capability"]), data["device_count"], data["reserved_after_free"])
    no_cache = case["mode"]["env"].get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
    problem = hardware.device_problem(case["arch"]["describe"], capability(case), case["mode"]["name"], no_cache,
                                      seen)
    return problem, {"probed_device": seen.name, "probed_capability": f"{seen.capability[0]}.{seen.capability[1]}",
                     "reserved_after_free": seen.reserved_after_free}


def observe_observed_reads(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """Each tensor role of the MoE layer poisoned in turn on the GPU: the roles whose poisoning changes the
    kernel's output, against the backend's declared reads."""
    import torch

    if not torch.cuda.is_available():
        raise Unobservable("observed_reads runs the selected kernel on the cell's GPU; this host has no CUDA device")
    seen = observed.measure(where["checkpoint"], capability(case))
    on = f"backend {seen.backend or '?'} on {case['arch']['describe']}"
    return observed_problem(on, seen, backends_of(case)), {"moe_backend": seen.backend or "",
                                                           "observed_reads": ",".join(sorted(seen.read)),
                                                           "roles_held": ",".join(sorted(seen.changed))}
