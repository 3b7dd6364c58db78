"""observed_reads: the backends' `reads:` lists drive the layer verdict and the audit, so they are tested, not
trusted. On the GPU the layer's output is compared with each tensor role poisoned in turn (measure.observed); the
roles whose poisoning changed it are what the kernel really reads, and they must be exactly the roles the matrix
says the backend reads, among those the layer holds."""

from __future__ import annotations

from collections.abc import Mapping

from quantmatrix import properties as P
from quantmatrix.checks.verdict import Verdict
from quantmatrix.measure.observed import Observation
from quantmatrix.schema.model import Case, MoeBackend


def observed_reads_verdict(case: Case, observation: Observation, backends: Mapping[str, MoeBackend]) -> Verdict:
    on = f"backend {observation.backend or '?'} on {case.cell.arch.describe()}"
    problem = observed_problem(on, observation, backends)
    backend = backends.get(observation.backend or "")
    if observation.error or backend is None:
        return Verdict.fail(case, problem or "")
    held = frozenset(observation.changed)
    properties = [(P.MOE_BACKEND, backend.name), (P.OBSERVED_READS, ",".join(sorted(observation.read))),
                  (P.DECLARED_READS, ",".join(sorted(backend.reads))), (P.ROLES_HELD, ",".join(sorted(held)))]
    return Verdict.of(case, problem, properties)


def observed_problem(on: str, observation: Observation, backends: Mapping[str, MoeBackend]) -> str | None:
    """The roles the kernel was seen to read against the backend's declared `reads:`, among the roles held."""
    if observation.error:
        return f"{on}: nothing could be observed: {observation.error}"
    backend = backends.get(observation.backend or "")
    if backend is None:
        return (f"{on}: backend {observation.backend} is not described under moe_backends, so there is no "
                "`reads:` to test")
    declared = backend.reads & frozenset(observation.changed)
    seen = observation.read
    problems = []
    for role in sorted(seen - declared):
        problems.append(f"the kernel reads {role} ({', '.join(observation.tensors[role])}: poisoning it changed "
                        f"the output) but moe_backends.{backend.name}.reads does not list it, so the audit never "
                        f"checks that {role} was loaded")
    for role in sorted(declared - seen):
        problems.append(f"moe_backends.{backend.name}.reads lists {role}, but poisoning "
                        f"{', '.join(observation.tensors[role])} left the output unchanged: the kernel does not "
                        "read it")
    return f"{on}: " + "; ".join(problems) if problems else None
