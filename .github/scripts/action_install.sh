#!/usr/bin/env bash
# The Action's venv (action.yml): the vLLM under test first, then quantmatrix from the Action's own checkout,
# editable so that `quantmatrix run` finds its suites/. quantmatrix depends on neither vLLM nor torch, so it never
# replaces what the first install chose.
set -euo pipefail
venv="${RUNNER_TEMP:?}/quantmatrix-venv"
python -m venv "$venv"
"$venv/bin/python" -m pip install "${QM_VLLM_SPEC:?}"
# vLLM's CPU build drags in torchvision/torchaudio/torchcodec builds that break `import vllm` (as setup.sh says)
"$venv/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec
"$venv/bin/python" -m pip install -e "${GITHUB_ACTION_PATH:?}"
