"""Every synthetic checkpoint the shipped matrices build, at every size, built fresh (never from the cache): the
sha256 of each file against tests/factory_digests.json, and what the fresh builds cost.

    PYTHONPATH=src python bench/factory_digests.py           # compare; exit 1 on any difference
    PYTHONPATH=src python bench/factory_digests.py --write   # record them

`--write` refuses to record different bytes under the same FACTORY_VERSION (checkpoints/store.py): the cache key
would then hand a runner the old bytes for a spec whose new bytes differ. Bump it, or record in a new environment
(the digests name the package versions they were made with). tests/test_factory_digests.py checks the same.
Measured on the 2-core CPU runner (factory v2): 48 builds (24 checkpoints x cpu_tiny, gpu_tiny) in 4.6 s after
imports (1.6 s), 6.4-10 s with the machine shared.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGESTS = ROOT / "tests" / "factory_digests.json"
MATRICES = (ROOT / "matrices" / "default.yaml", ROOT / "matrices" / "real.yaml")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"record the digests into {DIGESTS}")
    args = parser.parse_args()
    t0 = time.perf_counter()
    import torch  # noqa: F401  (imports counted once, separately)
    import transformers  # noqa: F401

    from quantmatrix.checkpoints import make, store
    from quantmatrix.schema.load import load

    specs = {label: spec for m in MATRICES for label, spec in make.every_build(load(m)).items()}
    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    built = {label: make.file_digests(spec) for label, spec in specs.items()}
    print(f"{len(built)} builds in {time.perf_counter() - t0:.2f} s (imports and matrices {t_import:.2f} s)")
    recorded = json.loads(DIGESTS.read_text()) if DIGESTS.is_file() else {"checkpoints": {}}
    drift = make.drift(recorded["checkpoints"], built)
    env = make.environment()
    print("\n".join(drift) or "every file as recorded")
    if not args.write:
        return 1 if drift else 0
    same_key = recorded.get("factory_version") == store.FACTORY_VERSION and recorded.get("environment") == env
    changed = [line for line in drift if not line.endswith("not recorded")]
    if changed and same_key:
        print(f"refused: bytes changed under FACTORY_VERSION {store.FACTORY_VERSION} in the recorded environment; "
              "bump FACTORY_VERSION", file=sys.stderr)
        return 1
    DIGESTS.write_text(json.dumps({"factory_version": store.FACTORY_VERSION, "environment": env,
                                   "checkpoints": built}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {DIGESTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
