"""End to end: the real engine on each cell, its output judged. Every check of a cell shares one engine start;
the cheap oracle (degeneration) decides first, the expensive ones only run on a group that passed it."""

from quantmatrix.checks import e2e as e2e_checks
from quantmatrix.checks import sanitize


def test_degeneration(case, engine_run, judge):
    """Greedy continuations of the fixed prompts are not degenerate (the seed bug emitted one token over and
    over), and a deliberately broken checkpoint is flagged; a poison mode whose plugin did not run fails."""
    judge(e2e_checks.degeneration, case, engine_run)


def test_agreement(case, engine_run, reference, judge):
    """At the first position where the engine's greedy tokens leave the reference's (transformers on the bf16
    or dequantized weights), each token is within the other's top-k logprobs (vLLM's check_logprobs_close)."""
    judge(e2e_checks.agreement, case, engine_run, reference)


def test_mode_invariance(case, engine_run, reference_mode_run, e2e, judge):
    """Every mode reproduces the reference mode's greedy tokens (up to the stated top-k tolerance): a mode that
    changes the output means something reads memory nobody wrote."""
    judge(e2e_checks.invariance, case, engine_run, reference_mode_run, e2e.reference_mode)


def test_task_accuracy(case, engine_run, reference, judge):
    """A real checkpoint's accuracy on the offline task set is not below the Wilson lower bound of its
    stored reference accuracy (minus the stated tolerance)."""
    judge(e2e_checks.accuracy, case, engine_run, reference)


def test_uninit_reads(case, engine_run, sanitized_run, judge):
    """Under compute-sanitizer initcheck (the sanitize mode), no kernel reads memory of a parameter or buffer of
    the model that nobody wrote, named by layer, tensor, experts and kernel; reads of activation and scratch
    memory are counted per kernel, never failed."""
    judge(sanitize.uninit_reads, case, engine_run, sanitized_run)
