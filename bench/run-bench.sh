#!/usr/bin/env bash
# run-bench.sh -- `make bench`: every benchmark, each printing its figures
# beside a baseline measured in the same run. Results are recorded by hand
# in docs/benchmarks.md with the machine they came from.
set -euo pipefail
: "${BUILD:=build}" "${DLOCK_BIN:=$BUILD/dlock}"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
"$BUILD/bench/file_handoff" "${HANDOFF_ROUNDS:-2000}"
"$BUILD/bench/run_cost" "$DLOCK_BIN" "${RUN_COST_RUNS:-300}"
# Network backends add their own scripts here (bench/*.sh, run in order).
for s in "$(dirname "$0")"/bench-*.sh; do
  [ -e "$s" ] && bash "$s"
done
exit 0
