#!/usr/bin/env bash
# bench-zk.sh -- the ZooKeeper part of `make bench`: starts a throwaway
# standalone ZooKeeper (Debian's package, generated zoo.cfg, temp data dir,
# free loopback port), runs `dlock bench` in each mode beside its raw
# baseline (EPHEMERAL create + delete with the same C client, see
# cli/bench_zk.c), and stops the server. Figures go to docs/benchmarks.md
# ("## ZooKeeper"). The contended run with 0.5 ms holds has kazoo's lock
# recipe on node beside it (bench/lib.sh's bench_peer).
# Knobs: ZK_BENCH_SECONDS (per measured run, default 3).
set -euo pipefail
: "${BUILD:=build}" "${DLOCK_BIN:=$BUILD/dlock}"
secs=${ZK_BENCH_SECONDS:-3}
jar=/usr/share/java/zookeeper.jar
[ -r "$jar" ] || { echo "bench-zk: $jar missing (Debian's zookeeper package)" >&2; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-zk-XXXXXX")
. "$(dirname "$0")/lib.sh"
start_zk() {
  port=$(bench_free_port) || return 1
  cat >"$dir/zoo.cfg" <<CFG
tickTime=250
initLimit=40
syncLimit=20
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
minSessionTimeout=500
maxSessionTimeout=60000
admin.enableServer=false
4lw.commands.whitelist=*
CFG
  java -Xmx512m -XX:+UseSerialGC -Dzookeeper.admin.enableServer=false \
    -cp "$jar:/usr/share/java/slf4j-simple.jar" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" >"$dir/zk.log" 2>&1 &
  pid=$!
}
zk_up() { [ "$( (exec 3<>/dev/tcp/127.0.0.1/"$port" && printf ruok >&3 && head -c4 <&3) 2>/dev/null)" = imok ]; }
pid=
trap 'kill $pid 2>/dev/null || :; wait $pid 2>/dev/null || :; rm -rf "$dir"' EXIT
bench_serve zk "$dir/zk.log" start_zk zk_up
url="zk://127.0.0.1:$port"
echo "== ZooKeeper standalone on $url"
"$DLOCK_BIN" -u "$url" bench uncontended -t 1 -m 64 -d "$secs"
"$DLOCK_BIN" -u "$url" bench contended -W 8 -d "$secs"
# the issue's contended run (4 processes, 0.5 ms holds) beside kazoo's
# Lock recipe on node (bench_peer: lib.sh), taking turns twice
peer_secs=$(awk -v s="$secs" 'BEGIN { print 2 * s }')
for _ in 1 2; do
  "$DLOCK_BIN" -u "$url" bench contended -W 4 -H 500 -d "$secs"
  bench_peer zk "127.0.0.1:$port" 4 500 "$peer_secs"
done
"$DLOCK_BIN" -u "$url" bench semaphore -P 4 -W 8 -d "$secs"
"$DLOCK_BIN" -u "$url" bench renewal -k 10000 -p 5 -l 3000
