#!/usr/bin/env bash
# bench-etcd.sh -- the etcd part of `make bench`: starts a throwaway etcd
# member on free loopback ports (temp data dir), runs `dlock bench` in
# each mode beside its raw baseline (a txn over the same JSON gateway and
# libcurl), times `etcdctl lock NAME true` beside `dlock run NAME true`
# per process with hyperfine when it is installed, and stops the member.
# The figures go to docs/benchmarks.md ("## etcd").
# Knobs: ETCD_BENCH_SECONDS (per measured run, default 3),
#        ETCD_BENCH_RUNS (hyperfine runs per command, default 100).
set -euo pipefail
: "${BUILD:=build}" "${DLOCK_BIN:=$BUILD/dlock}"
secs=${ETCD_BENCH_SECONDS:-3}
runs=${ETCD_BENCH_RUNS:-100}
command -v etcd >/dev/null || { echo "bench-etcd: etcd not installed" >&2; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-etcd-XXXXXX")
. "$(dirname "$0")/lib.sh"
start_etcd() {
  port=$(bench_free_port) && peer=$(bench_free_port "$port") || return 1
  etcd --name b0 --data-dir "$dir/data.$port" \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "b0=http://127.0.0.1:$peer" >"$dir/etcd.log" 2>&1 &
  pid=$!
}
etcd_up() { etcdctl --endpoints "127.0.0.1:$port" --dial-timeout 1s endpoint health >/dev/null 2>&1; }
pid=
trap 'kill $pid 2>/dev/null || :; wait $pid 2>/dev/null || :; rm -rf "$dir"' EXIT
bench_serve etcd "$dir/etcd.log" start_etcd etcd_up
url="etcd://127.0.0.1:$port"
echo "== etcd $(etcd --version | sed -n 's/^etcd Version: //p') on $url"
"$DLOCK_BIN" -u "$url" bench uncontended -t 1 -m 1024 -d "$secs"
"$DLOCK_BIN" -u "$url" bench contended -W 8 -d "$secs"
"$DLOCK_BIN" -u "$url" bench semaphore -P 4 -W 8 -d "$secs"
"$DLOCK_BIN" -u "$url" bench renewal -k 10000 -p 5 -l 3000
"$DLOCK_BIN" -u "$url" bench multi -K 8 -d "$secs"
if command -v hyperfine >/dev/null; then
  hyperfine -N --warmup 5 --runs "$runs" \
    "etcdctl --endpoints 127.0.0.1:$port lock bench-run true" \
    "$DLOCK_BIN -u $url run bench-run true"
else
  echo "bench-etcd: hyperfine not installed: per-process timing skipped"
fi
