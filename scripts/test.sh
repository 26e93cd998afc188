#!/usr/bin/env bash
# Runs the whole suite in the set-up environment; extra arguments go to pytest (e.g. -x -k build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
source "$ROOT/scripts/env.sh"
cd "$ROOT"
# -rs: every skip with its reason; in strict mode (EDGEFM_STRICT_TESTS=1, .ci/run) only skips of the kinds
# tests/skips.py allows (no GPU, CPU instruction set, opt-in) pass, the others fail the run
exec python -m pytest -q -rs "$@"   # testpaths = tests (pyproject.toml)
