#!/usr/bin/env bash
# bench-mysql.sh -- the MySQL/MariaDB part of `make bench`: starts a
# throwaway mariadbd on a free loopback port (a fresh data directory in
# a temp dir, performance_schema on for inspect, as
# tests/lib/fixture_mysql.c starts its servers), runs
# `dlock bench` uncontended (pair rate beside the raw libmariadb floor,
# GET_LOCK + RELEASE_LOCK) and contended (hand-off in round trips), and
# stops the server. The figures go to docs/benchmarks.md ("MySQL /
# MariaDB"). Knobs: MYSQL_BENCH_SECONDS (per measured run, default 3).
set -euo pipefail
: "${BUILD:=build}" "${DLOCK_BIN:=$BUILD/dlock}"
secs=${MYSQL_BENCH_SECONDS:-3}
for p in mariadbd mariadb-install-db mariadb; do
  command -v "$p" >/dev/null || { echo "bench-mysql: $p not installed" >&2; exit 1; }
done
dir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-mysql-XXXXXX")
. "$(dirname "$0")/lib.sh"
user=()
[ "$(id -u)" = 0 ] && user=(--user=root)
innodb=(--innodb-log-file-size=4M --innodb-buffer-pool-size=16M)
mariadb-install-db --no-defaults --datadir="$dir/data" --auth-root-authentication-method=normal \
  --skip-test-db "${innodb[@]}" "${user[@]}" >"$dir/install.log" 2>&1 ||
  { echo "bench-mysql: mariadb-install-db failed:" >&2; tail -n 5 "$dir/install.log" >&2; exit 1; }
mkdir "$dir/data/dlock" # a directory is a database
start_mysql() {
  port=$(bench_free_port) || return 1
  mariadbd --no-defaults --datadir="$dir/data" --port="$port" --socket="$dir/mysql.sock" \
    --pid-file="$dir/mariadbd.pid" --bind-address=127.0.0.1 --skip-name-resolve "${innodb[@]}" \
    --performance-schema=ON "${user[@]}" >"$dir/mariadbd.log" 2>&1 &
  pid=$!
}
mysql_up() {
  mariadb --no-defaults -uroot --socket="$dir/mysql.sock" -N -B -e 'SELECT 1' >/dev/null 2>&1
}
pid=
trap 'kill $pid 2>/dev/null || :; wait $pid 2>/dev/null || :; rm -rf "$dir"' EXIT
bench_serve mysql "$dir/mariadbd.log" start_mysql mysql_up
url="mysql://root@127.0.0.1:$port/dlock"
echo "== mariadb $(mariadbd --version | sed -n 's/.*Ver \([^ ]*\).*/\1/p') on $url"
"$DLOCK_BIN" -u "$url" bench uncontended -t 1 -d "$secs"
"$DLOCK_BIN" -u "$url" bench contended -W 8 -d "$secs"
