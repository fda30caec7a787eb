#!/usr/bin/env bash
# bench-redis.sh -- the Redis part of `make bench`: starts a throwaway
# redis-server on a free loopback port (no persistence, temp dir), runs
# `dlock bench` in each mode beside its raw hiredis baseline, and stops
# the server. The figures go to docs/benchmarks.md ("## Redis"). The
# contended run with 0.5 ms holds has node-redlock beside it (npm, into
# $BUILD/bench-peers: bench/lib.sh's bench_peer).
# Knobs: REDIS_BENCH_SECONDS (per measured run, default 3).
set -euo pipefail
: "${BUILD:=build}" "${DLOCK_BIN:=$BUILD/dlock}"
secs=${REDIS_BENCH_SECONDS:-3}
command -v redis-server >/dev/null || { echo "bench-redis: redis-server not installed" >&2; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-redis-XXXXXX")
. "$(dirname "$0")/lib.sh"
start_redis() {
  port=$(bench_free_port) || return 1
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    >"$dir/redis.log" 2>&1 &
  pid=$!
}
redis_up() { (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null; }
pid=
trap 'kill $pid 2>/dev/null || :; wait $pid 2>/dev/null || :; rm -rf "$dir"' EXIT
bench_serve redis "$dir/redis.log" start_redis redis_up
url="redis://127.0.0.1:$port"
echo "== redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on $url"
"$DLOCK_BIN" -u "$url" bench uncontended -t 1 -m 1024 -d "$secs"
"$DLOCK_BIN" -u "$url?layout=simple" bench uncontended -t 1 -m 1024 -d "$secs"
"$DLOCK_BIN" -u "$url?layout=fair" bench uncontended -t 1 -m 1024 -d "$secs"
"$DLOCK_BIN" -u "$url?layout=fair" bench contended -W 8 -d "$secs"
"$DLOCK_BIN" -u "$url" bench uncontended -t 32 -m 1024 -d "$secs"
"$DLOCK_BIN" -u "$url" bench contended -W 8 -d "$secs"
# the issue's contended run (4 processes, 0.5 ms holds) beside its peer,
# node-redlock, taking turns twice (bench_peer: lib.sh)
peer_secs=$(awk -v s="$secs" 'BEGIN { print 2 * s }')
for _ in 1 2; do
  "$DLOCK_BIN" -u "$url" bench contended -W 4 -H 500 -d "$secs"
  bench_peer redis "127.0.0.1:$port" 4 500 "$peer_secs"
done
"$DLOCK_BIN" -u "$url" bench semaphore -P 4 -W 8 -d "$secs"
"$DLOCK_BIN" -u "$url" bench renewal -k 10000 -p 5 -l 3000
"$DLOCK_BIN" -u "$url" bench readers -R 8 -d "$secs"
"$DLOCK_BIN" -u "$url" bench multi -K 8 -d "$secs"
"$DLOCK_BIN" -u "$url" bench async -W 1000
