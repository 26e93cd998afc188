#!/usr/bin/env bash
# The longer fuzz campaign: every fuzz target of tests/fuzz with N cases each (default 5000; CI runs 150),
# then one line per target: cases run, how many were refused with the documented error, the wall time.
#   bash scripts/fuzz.sh [N] [extra pytest arguments, e.g. -k safetensors]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
source "$ROOT/scripts/env.sh"
cd "$ROOT"
N="${1:-5000}"
shift || true
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
start=$(date +%s)
set +e
# memory stays bounded: an allocation a corrupted header asks for beyond this fails the case (MemoryError)
# instead of taking the machine down
ulimit -v "${EDGEFM_FUZZ_MAX_VM_KB:-6291456}"
EDGEFM_FUZZ_PROFILE=campaign EDGEFM_FUZZ_EXAMPLES="$N" python -m pytest -q -p no:cacheprovider tests/fuzz -k fuzz_ \
  --hypothesis-show-statistics "$@" >"$LOG" 2>&1
rc=$?
set -e
# hypothesis statistics: "<test id>:", "- N passing, F failing, and I invalid test cases", "* P%, refused",
# "- during generate phase (S seconds)": one line per target
python - "$LOG" "$(( $(date +%s) - start ))" <<'PY'
import re, sys
rows, cur = [], None
for line in open(sys.argv[1]):
    line = line.strip()
    if re.match(r"^tests/fuzz/.*::\S+:$", line):
        cur = {"name": line[:-1].split("::")[-1], "cases": 0, "failing": 0, "refused": 0.0, "s": 0.0}
        rows.append(cur)
    elif cur and (m := re.search(r"(\d+) passing, (\d+) failing", line)):
        cur["cases"], cur["failing"] = int(m[1]) + int(m[2]), int(m[2])
    elif cur and (m := re.search(r"([\d.]+)%, refused", line)):  # "refused" or "refused (<how>)": one per case
        cur["refused"] += float(m[1])
    elif cur and (m := re.search(r"generate phase \(([\d.]+) seconds\)", line)):
        cur["s"] += float(m[1])
for r in rows:
    print(f"{r['name']:34s} {r['cases']:7d} cases  {r['refused']:5.1f}% refused  {r['failing']} failing  {r['s']:.0f} s")
print(f"total {sum(r['cases'] for r in rows)} cases over {len(rows)} targets in {sys.argv[2]} s")
PY
if [[ $rc -ne 0 ]]; then
  tail -60 "$LOG"
  echo "fuzz campaign FAILED (pytest exit $rc)" >&2
fi
exit $rc
