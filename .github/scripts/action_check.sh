#!/usr/bin/env bash
# The Action's workflow test (.github/workflows/action-test.yml): with tests/data/action/matrix.yaml the run exits
# 1, the report holds 4 cases of which exactly the bad export's two are red (config_dispatch: vLLM resolves its
# weight-only config; checkpoint_lint: its files are not the W4A4 export the matrix names), the config_dispatch
# failure has a repro bundle, and the report links it.
set -euo pipefail
out=$1
code=$2
fail() { echo "::error::$*"; exit 1; }
[ "$code" = 1 ] || fail "the Action exited '$code', expected 1 (one red export)"
[ -f "$out/report/summary.json" ] || fail "no report at $out/report"
python3 - "$out/report/summary.json" <<'PY' || fail "the report's cases are not 4 with exactly the bad export's red"
import json
import sys

cases = json.load(open(sys.argv[1], encoding="utf-8"))["cases"]
red = sorted(k for k, c in cases.items() if c["outcome"] in ("failed", "error"))
print(f"{len(cases)} cases, red: {red}")
sys.exit(len(cases) != 4 or red != ["suites.test_checkpoints::test_checkpoint_lint[export-claims-w4a4@sm121-default]",
                                    "suites.test_dispatch::test_config_dispatch[export-claims-w4a4@sm121-default]"])
PY
bundle=$(grep -l '"check": "config_dispatch"' "$out"/repro/*/case.json | head -1)
[ -n "$bundle" ] || fail "no repro bundle of the config_dispatch failure under $out/repro"
[ -f "$(dirname "$bundle")/repro.py" ] || fail "the bundle has no repro.py"
grep -q '\[repro bundle\](\.\./repro/' "$out/report/matrix.md" || fail "the report does not link the bundle"
echo "the Action failed exactly the bad export, bundled it and linked the bundle"
