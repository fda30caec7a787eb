#!/usr/bin/env bash
# run-bench.sh -- `make bench`: every benchmark, each printing its figures
# beside a baseline measured in the same run, then a one-screen summary
# table of the targets (bench/summary.sh). Results are recorded by hand
# in docs/benchmarks.md with the machine they came from.
set -euo pipefail
: "${BUILD:=build}" "${DLOCK_BIN:=$BUILD/dlock}"
log="$BUILD/bench.log"
{
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  "$BUILD/bench/file_handoff" "${HANDOFF_ROUNDS:-2000}"
  "$BUILD/bench/run_cost" "$DLOCK_BIN" "${RUN_COST_RUNS:-300}"
  # Network backends add their own scripts here (bench/*.sh, run in order).
  for s in "$(dirname "$0")"/bench-*.sh; do
    [ -e "$s" ] && bash "$s"
  done
} 2>&1 | tee "$log"
# The one-screen summary: every target of issue 28, met or not (what
# docs/benchmarks.md carries); the whole output stays in $log.
echo
echo "== summary ($(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); all in $log)"
"$(dirname "$0")/summary.sh" "$log"
exit 0
