#!/usr/bin/env bash
# Runs the demo (bag -> nodes -> recorded output, summary and plot) in the set-up environment.
# Extra arguments go to edgefm-demo (see `edgefm-demo --help`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec edgefm-demo "$@"
