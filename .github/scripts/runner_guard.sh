#!/usr/bin/env bash
# Refuse a job on a GPU runner unless it is the nightly from the default branch: a scheduled night, or a dispatch
# whose inputs a reviewer of the protected environment `nightly-dispatch` approved. It is the first step of every
# self-hosted job (nightly-arch.yml), and the runner's own job-started hook (docs/runners.md:
# ACTIONS_RUNNER_HOOK_JOB_STARTED), which no branch's YAML can remove: run there with --hook, where the workflow's
# inputs are not visible and the workflow ref (main's nightly.yml, which holds the approval gate) decides.
#
# Reads GitHub's own variables: GITHUB_EVENT_NAME, GITHUB_REF, GITHUB_WORKFLOW_REF, GITHUB_REPOSITORY; and
# QM_DEFAULT_BRANCH (default main), QM_APPROVED (the approval job's result, step mode only).
set -euo pipefail
main=${QM_DEFAULT_BRANCH:-main}
nightly="${GITHUB_REPOSITORY:-?}/.github/workflows/nightly.yml@refs/heads/$main"
refuse() {
  echo "::error::runner guard: refused: $1 (only the nightly from $main runs here: docs/runners.md, Security)"
  exit 1
}
case "${GITHUB_EVENT_NAME:-}" in
  schedule | workflow_dispatch) ;;
  *) refuse "event '${GITHUB_EVENT_NAME:-}'" ;;
esac
[ "${GITHUB_REF:-}" = "refs/heads/$main" ] || refuse "ref '${GITHUB_REF:-}'"
[ "${GITHUB_WORKFLOW_REF:-}" = "$nightly" ] || refuse "workflow '${GITHUB_WORKFLOW_REF:-}'"
if [ "${GITHUB_EVENT_NAME}" = workflow_dispatch ] && [ "${1:-}" != --hook ] && [ "${QM_APPROVED:-}" != success ]; then
  refuse "a dispatch whose inputs were not approved in the environment nightly-dispatch (approval: '${QM_APPROVED:-}')"
fi
echo "runner guard: ${GITHUB_EVENT_NAME} of $nightly"
