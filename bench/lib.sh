# shellcheck shell=bash
# lib.sh -- what bench/bench-*.sh share: starting a throwaway server on a
# free loopback port. A port is taken below the kernel's ephemeral range:
# one inside it can be another connection's local port, where a connect
# finds no listener yet the server's bind fails. A server that exits
# before it answers is started again on another port, instead of being
# waited for until the probe gives up.

# bench_free_port [PORT]: print a loopback port nobody listens on (not PORT).
bench_free_port() {
  local lo p
  lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null) || lo=32768
  for _ in $(seq 1 50); do
    p=$((10000 + RANDOM % (lo - 10000)))
    if [ "$p" != "${1:-}" ] && ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# bench_serve NAME LOG START PROBE: run START (a function that picks
# $port, starts the server in the background, its output to LOG, and sets
# $pid) until PROBE answers, at most 5 servers and 30 s each; fail with
# LOG's end if none does. The caller's EXIT trap stops $pid.
# shellcheck disable=SC2154 # $pid is set by START
bench_serve() {
  local name=$1 log=$2 start=$3 probe=$4
  for _ in 1 2 3 4 5; do
    "$start" || { echo "bench-$name: no free port" >&2; return 1; }
    for _ in $(seq 1 300); do
      "$probe" && return 0
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill "$pid" 2>/dev/null || :
    wait "$pid" 2>/dev/null || :
  done
  echo "bench-$name: the server did not start; the end of its log:" >&2
  tail -n 5 "$log" >&2
  return 1
}

# bench_peer KIND HOST:PORT PROCS HOLD_US SECS: the peers' contended run
# (bench/peer_contended.js) beside `dlock bench contended -H`; a line
# saying why when node or the packages are missing. The packages (the
# versions pinned here) are installed once with npm into
# $BUILD/bench-peers: `make bench` only, never CI or the install.
BENCH_PEER_PACKAGES="redlock@4.2.0 ioredis@5.11.1 node-zookeeper-client@1.1.3"
bench_peer() {
  local dir=${BUILD:-build}/bench-peers
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "peer $1: not run (node or npm not installed)"
    return 0
  fi
  if [ ! -e "$dir/.installed" ] || [ "$(cat "$dir/.installed")" != "$BENCH_PEER_PACKAGES" ]; then
    mkdir -p "$dir"
    # shellcheck disable=SC2086 # one word per package
    if ! npm install --prefix "$dir" --no-audit --no-fund --no-save $BENCH_PEER_PACKAGES \
      >"$dir/npm.log" 2>&1; then
      echo "peer $1: not run (npm install failed: $dir/npm.log)"
      return 0
    fi
    echo "$BENCH_PEER_PACKAGES" >"$dir/.installed"
  fi
  NODE_PATH="$dir/node_modules" node "$(dirname "${BASH_SOURCE[0]}")/peer_contended.js" "$@" ||
    echo "peer $1: failed"
}
