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
