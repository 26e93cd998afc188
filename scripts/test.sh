#!/usr/bin/env bash
# Runs the whole suite in the set-up environment; extra arguments go to pytest (e.g. -x -k build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec python -m pytest -q "$@"   # testpaths = tests (pyproject.toml)
