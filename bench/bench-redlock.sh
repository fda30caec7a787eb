#!/usr/bin/env bash
# bench-redlock.sh -- the Redlock part of `make bench`: three throwaway
# redis-servers on free loopback ports (no persistence, temp dirs), and
# bench/redlock_stalled over them: acquire+release with every node
# answering, then with the third stopped (SIGSTOP), in the same run. The
# figures go to docs/benchmarks.md ("A node stopped").
# Knobs: REDLOCK_STALLED_ROUNDS (per phase, default 300).
set -euo pipefail
: "${BUILD:=build}"
command -v redis-server >/dev/null || { echo "bench-redlock: redis-server not installed" >&2; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-redlock-XXXXXX")
pids=()
trap 'kill -CONT "${pids[@]}" 2>/dev/null; kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
hosts=
for i in 1 2 3; do
  port=
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then port=$p; break; fi
  done
  [ -n "$port" ] || { echo "bench-redlock: no free port" >&2; exit 1; }
  mkdir "$dir/$i"
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir/$i" \
    >"$dir/$i/redis.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do
    (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break
    sleep 0.05
  done
  hosts="$hosts${hosts:+,}127.0.0.1:$port"
done
"$DLOCK_BIN" -u "redlock://$hosts" bench uncontended -t 1 -m 1024 -d "${REDIS_BENCH_SECONDS:-3}"
"$BUILD/bench/redlock_stalled" "redlock://$hosts" "${pids[2]}" "${REDLOCK_STALLED_ROUNDS:-300}"
