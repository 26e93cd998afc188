# Sourced by scripts/setup.sh, test.sh and demo.sh (and by hand: `source scripts/env.sh`):
# activates .venv, overlays the colcon install space and selects the shared-memory Fast DDS profile.
# Safe under `set -euo pipefail`.

EDGEFM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export EDGEFM_ROOT

if [[ ! -x "$EDGEFM_ROOT/.venv/bin/python" ]]; then
  echo "edgefm_ros: $EDGEFM_ROOT/.venv is missing; run scripts/setup.sh first" >&2
  return 1
fi

# The venv's python re-executes itself once with LD_LIBRARY_PATH set (ROS wheels' .pth bootstrapper);
# a guard inherited from another environment would skip that step.
unset _ROS_WHEELS_BOOTSTRAP_COMPLETE

# activate and colcon's setup.bash read unset variables: relax `set -u` around them, then restore it
case $- in *u*) _edgefm_nounset=1 ;; *) _edgefm_nounset=0 ;; esac
set +u
# shellcheck disable=SC1091
source "$EDGEFM_ROOT/.venv/bin/activate"
# The ROS wheels install their ament index into the venv prefix.
export AMENT_PREFIX_PATH="$VIRTUAL_ENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
if [[ -f "$EDGEFM_ROOT/install/setup.bash" ]]; then
  # shellcheck disable=SC1091
  source "$EDGEFM_ROOT/install/setup.bash"
fi
if [[ $_edgefm_nounset == 1 ]]; then set -u; fi
unset _edgefm_nounset
# The working tree ahead of the install space's copy (setup.sh links edgefm_ros and edgefm_kernels
# there): edits need no rebuild, and edgefm_ros.__path__ still reaches the install
# space for the generated edgefm_ros.msg.
export PYTHONPATH="$VIRTUAL_ENV/edgefm_src${PYTHONPATH:+:$PYTHONPATH}"

# Discovery stays on this host unless the caller says otherwise (tests, demo and replay are local).
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
export RMW_IMPLEMENTATION="${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}"
# Fast DDS 2.x (Jazzy) and 3.x (Kilted) read their XML profile from different variables.
export FASTRTPS_DEFAULT_PROFILES_FILE="$EDGEFM_ROOT/config/fastdds_shm.xml"
export FASTDDS_DEFAULT_PROFILES_FILE="$EDGEFM_ROOT/config/fastdds_shm.xml"
# The simulator (edgefm_ros/sim) renders headless through Mesa: EGL unless the caller chose (osmesa needs
# PyOpenGL told too).
export MUJOCO_GL="${MUJOCO_GL:-egl}"
if [[ $MUJOCO_GL == osmesa ]]; then export PYOPENGL_PLATFORM="${PYOPENGL_PLATFORM:-osmesa}"; fi
