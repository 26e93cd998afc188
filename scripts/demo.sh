#!/usr/bin/env bash
# Runs the demo in the set-up environment: `sim` is the closed loop in simulation (sim_node + vla_node +
# action_node with the trained checkpoint: report, video, plot); `bag [BAG]` is the bag replay.
# The arguments go to edgefm-demo (see `edgefm-demo --help`), e.g. `bash scripts/demo.sh sim`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec edgefm-demo "$@"
