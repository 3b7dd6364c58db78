#!/usr/bin/env bash
# The Action's cpu tier (action.yml): every cpu-tier case of the caller's matrix into JUnit, a repro bundle per
# failed case, the report (linking them) into the job's step summary; exits as the run did (1: failed cases, 2: a
# bad matrix or option) once everything is written, and says so in the step output exit-code.
set -euo pipefail
qm="${RUNNER_TEMP:?}/quantmatrix-venv/bin/quantmatrix"
case "${QM_MATRIX:?}" in
  /*) matrix=$QM_MATRIX ;;
  *) matrix="${GITHUB_WORKSPACE:?}/$QM_MATRIX" ;;
esac
case "${QM_OUT:?}" in
  /*) out=$QM_OUT ;;
  *) out="${GITHUB_WORKSPACE:?}/$QM_OUT" ;;
esac
cd "${GITHUB_ACTION_PATH:?}"  # the checkout holding suites/
rc=0
"$qm" run --matrix "$matrix" --run-id action --out "$out/run" -m cpu -rs || rc=$?
if [ -f "$out/run/junit.xml" ]; then
  if [ "$rc" -eq 1 ]; then
    "$qm" repro --failed --junit "$out/run" --matrix "$matrix" --out "$out/repro" \
      || echo "::warning::some failed cases got no repro bundle (named above)"
  fi
  "$qm" report "$out/run" --out "$out/report" --bundles "$out/repro" || true
fi
if [ -f "$out/report/matrix.md" ]; then head -c 1000000 "$out/report/matrix.md" >> "${GITHUB_STEP_SUMMARY:?}"; fi
echo "exit-code=$rc" >> "${GITHUB_OUTPUT:?}"
exit "$rc"
