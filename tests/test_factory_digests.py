"""Every synthetic checkpoint the shipped matrices build, at every size, is byte-identical to the digests recorded
in tests/factory_digests.json (bench/factory_digests.py --write records them; it refuses different bytes under the
same FACTORY_VERSION). Built fresh, never from the cache: all 48 take about 5 s here, so the test builds every
one rather than a sample of the factory's paths."""

from __future__ import annotations

import json
from pathlib import Path

from quantmatrix.checkpoints import make, store
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parents[1]
RECORDED = json.loads((ROOT / "tests" / "factory_digests.json").read_text())


def test_every_synthetic_checkpoint_writes_the_recorded_bytes():
    """A change to the factory (a scheme or producer module, the family, the faults, the configs) that moves one
    byte of one file of one checkpoint fails, naming the checkpoint and the file."""
    specs = {label: spec for m in ("default.yaml", "real.yaml")
             for label, spec in make.every_build(load(ROOT / "matrices" / m)).items()}
    drift = make.drift(RECORDED["checkpoints"], {label: make.file_digests(spec) for label, spec in specs.items()})
    env = make.environment()
    where = "" if env == RECORDED["environment"] else (
        f"\n(recorded with {RECORDED['environment']}; this environment has {env})")
    assert not drift, ("the factory no longer writes the recorded bytes; if that is intended, bump "
                       "FACTORY_VERSION and run bench/factory_digests.py --write:\n" + "\n".join(drift) + where)
    assert RECORDED["factory_version"] == store.FACTORY_VERSION, (
        f"digests recorded at factory version {RECORDED['factory_version']}, the factory is at "
        f"{store.FACTORY_VERSION}: run bench/factory_digests.py --write")


def test_drift_names_each_checkpoint_and_file_that_differs():
    recorded = {"a@cpu_tiny": {"config.json": "1", "model.safetensors": "2"}, "gone@cpu_tiny": {"x": "0"}}
    built = {"a@cpu_tiny": {"config.json": "1", "model.safetensors": "3", "extra.json": "4"}, "new@cpu_tiny": {}}
    assert make.drift(recorded, built) == ["a@cpu_tiny: extra.json, model.safetensors differ",
                                           "gone@cpu_tiny: recorded, but no matrix builds it",
                                           "new@cpu_tiny: not recorded"]
    assert make.drift(recorded, recorded) == []
