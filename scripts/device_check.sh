#!/usr/bin/env bash
# GPU device check, offline: build, verify every GPU skill against the PyTorch reference, time
# edgefm exact / fast / fast + CUDA graph against LeRobot's eager SmolVLA (FULL, 3 cameras) on the
# same GPU, print one table. Target: under 8 minutes on an H100/H200-class machine.
#
#   scripts/device_check.sh [WHEELS_DIR]     (default: ../wheels beside the repository)
#
# WHEELS_DIR holds every wheel the run needs, brought along (no network): torch 2.13.0 (CUDA build),
# lerobot 0.4.4 and the harness's requirements-lock.txt set, pyyaml/safetensors/tokenizers, and
# optionally flashinfer-python (+ flashinfer-cubin) and triton (their skills are skipped when absent).
# Environment: VENV (default /tmp/edgefm-gpu-venv), WORK (default /tmp/edgefm-gpu-work),
# SHARED (default ../shared beside the repository), PYTHON (default python3), JSON (result file).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WHEELS="$(cd "${1:-$ROOT/../wheels}" && pwd)"
VENV="${VENV:-/tmp/edgefm-gpu-venv}"
WORK="${WORK:-/tmp/edgefm-gpu-work}"
SHARED="${SHARED:-$ROOT/../shared}"
PYTHON="${PYTHON:-python3}"
start=$(date +%s)
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS" PIP_DISABLE_PIP_VERSION_CHECK=1
unset _ROS_WHEELS_BOOTSTRAP_COMPLETE LD_LIBRARY_PATH PYTHONPATH || true

echo "== build: venv from $WHEELS"
mkdir -p "$WORK"
if [ ! -d "$WORK/lerobot_harness" ]; then
  cp -r "$SHARED/reference/lerobot_harness" "$SHARED/reference/vlm" "$WORK/"
fi
if [ ! -x "$VENV/bin/python" ]; then
  VENV="$VENV" PYTHON="$PYTHON" bash "$WORK/lerobot_harness/setup_venv.sh" >"$WORK/setup.log" 2>&1 \
    || { tail -20 "$WORK/setup.log"; echo "venv setup failed (log: $WORK/setup.log)"; exit 1; }
  "$VENV/bin/pip" install --quiet pyyaml safetensors tokenizers
  "$VENV/bin/pip" install --quiet flashinfer-python flashinfer-cubin 2>/dev/null || echo "   (no flashinfer wheels: its skill is skipped)"
  "$VENV/bin/pip" install --quiet triton 2>/dev/null || echo "   (no triton wheel: its skill is skipped)"
fi
"$VENV/bin/pip" install --quiet --no-deps --no-build-isolation -e "$ROOT" >/dev/null

echo "== FULL checkpoint and goldens (LeRobot's own code; generated once)"
if [ ! -f "$WORK/lerobot_harness/artifacts/full/checkpoint/model.safetensors" ]; then
  (cd "$WORK/lerobot_harness" && "$VENV/bin/python" make_goldens.py --variants full >"$WORK/goldens.log" 2>&1) \
    || { tail -20 "$WORK/goldens.log"; exit 1; }
fi

echo "== checks and timings"
"$VENV/bin/python" "$ROOT/benchmarks/device_check.py" --harness "$WORK/lerobot_harness" ${JSON:+--json "$JSON"}
echo "== done in $(( $(date +%s) - start )) s"
