#!/usr/bin/env bash
# bench-postgres.sh -- the PostgreSQL part of `make bench`: initdb into a
# temp dir and a throwaway postgres on a free loopback port (fsync off,
# as tests/lib/fixture_pg.c starts its servers; as nobody when run as
# root, which postgres refuses to be), runs `dlock bench` uncontended
# (pair rate beside the raw libpq floor, pg_try_advisory_lock +
# pg_advisory_unlock) and contended (hand-off in round trips), and stops
# the server. The figures go to docs/benchmarks.md ("PostgreSQL").
# Knobs: PG_BENCH_SECONDS (per measured run, default 3).
set -euo pipefail
: "${BUILD:=build}" "${DLOCK_BIN:=$BUILD/dlock}"
secs=${PG_BENCH_SECONDS:-3}
bin=$(find /usr/lib/postgresql -path '*/bin/postgres' 2>/dev/null | sort -V | tail -n 1)
bin=${bin%postgres}
[ -x "${bin}postgres" ] || bin=$(dirname "$(command -v postgres 2>/dev/null || echo /x/x)")/
[ -x "${bin}postgres" ] && [ -x "${bin}initdb" ] ||
  { echo "bench-postgres: postgres/initdb not installed" >&2; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-pg-XXXXXX")
. "$(dirname "$0")/lib.sh"
as=()
if [ "$(id -u)" = 0 ]; then
  chown 65534:65534 "$dir"
  as=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
"${as[@]}" "${bin}initdb" -D "$dir/data" -U postgres --auth=trust -N --locale=C -E UTF8 \
  >"$dir/initdb.log" 2>&1 ||
  { echo "bench-postgres: initdb failed:" >&2; tail -n 5 "$dir/initdb.log" >&2; exit 1; }
start_pg() {
  port=$(bench_free_port) || return 1
  "${as[@]}" "${bin}postgres" -D "$dir/data" -k "$dir" -p "$port" -c listen_addresses=127.0.0.1 \
    -F -c max_connections=200 -c shared_buffers=16MB >"$dir/postgres.log" 2>&1 &
  pid=$!
}
pg_up() { "${bin}pg_isready" -q -h 127.0.0.1 -p "$port" 2>/dev/null; }
pid=
trap 'kill $pid 2>/dev/null || :; wait $pid 2>/dev/null || :; rm -rf "$dir"' EXIT
bench_serve postgres "$dir/postgres.log" start_pg pg_up
url="postgres://postgres@127.0.0.1:$port/postgres"
echo "== postgres $("${bin}postgres" --version | sed -n 's/.* \([0-9][0-9.]*\).*/\1/p') on $url"
"$DLOCK_BIN" -u "$url" bench uncontended -t 1 -d "$secs"
"$DLOCK_BIN" -u "$url" bench contended -W 8 -d "$secs"
