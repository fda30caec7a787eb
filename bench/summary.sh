#!/usr/bin/env bash
# summary.sh LOG -- the one-screen table at the end of `make bench`: each
# target of docs/benchmarks.md ("Summary") with the figure this run
# measured (a ratio to its own baseline, or a cost), the goal, and
# whether it was met (rows "25": issue 25's SQL backends). LOG is what
# bench/run-bench.sh printed; a figure the run did not produce (a server
# not installed, a peer not run) is "-", never a guess. Row 3 divides
# dlock's mean acquisitions/s in the contended runs with holds by its
# peer's in the same run (node-redlock; kazoo's recipe on
# node-zookeeper-client).
set -euo pipefail
log=${1:?usage: summary.sh LOG}
awk '
function label(url, backend,   l) {
    if (url ~ /^redlock:/) return "redlock"
    l = backend
    if (match(url, /layout=[a-z-]+/)) l = l " " substr(url, RSTART + 7, RLENGTH - 7)
    else if (backend == "redis") l = l " default"
    return l
}
function num(s) { gsub(/[^0-9.]/, "", s); return s + 0 }
/^dlock bench on / {
    url = $4; b = $5; gsub(/[(]/, "", b); cur = label(url, b); mode = ""; next
}
/^uncontended: 1 thread/ { mode = "unc1"; next }
/^uncontended:/ { mode = "uncN"; next }
/^contended:.* hold [0-9]+ us/ { mode = "conth"; next }
/^contended:/ { mode = "cont"; next }
/^renewal:/ { mode = "renew"; next }
mode == "unc1" && /rate ratio, median round/ && !(cur in unc) { unc[cur] = num($5); next }
mode == "unc1" && /^  floor 0:/ { floor0 = 1; next }
mode == "unc1" && floor0 && /dlock \/ floor/ {
    if (match($0, /dlock \/ floor [0-9.]+x/)) redlock = num(substr($0, RSTART + 14, RLENGTH - 14))
    floor0 = 0; next
}
mode == "cont" && /hand-off p50/ && !(cur in rt) {
    if (match($0, /= [0-9.]+ round trips/)) rt[cur] = num(substr($0, RSTART, RLENGTH - 12))
    next
}
/^peer .*acquisitions\/s [0-9.]+$/ {
    k = $0 ~ /redlock/ ? "redis default" : $0 ~ /zookeeper/ ? "zk" : ""
    if (k != "") { peer[k] += $NF; npeer[k]++ }
    next
}
mode == "conth" && /^  acquisitions\/s/ { held[cur] += $2; nheld[cur]++; next }
mode == "renew" && /client CPU per period/ {
    if (match($0, /[(][0-9.]+ us per lock/)) cpu[cur] = num(substr($0, RSTART, RLENGTH - 12))
    next
}
mode == "renew" && /holds lost meanwhile/ { lost[cur] = $4 + 0; next }
/ratio dlock\/flock: median/ && /p99/ && !file { file = num($4); next }
function row(t, what, have, shown, goal, ok) {
    printf "%-2s %-40s %-14s %-10s %s\n", t, what, have ? shown : "-", goal,
           have ? (ok ? "met" : "NOT MET") : "-"
}
END {
    printf "%-2s %-40s %-14s %-10s %s\n", "#", "figure (this run)", "measured", "target", "verdict"
    n = split("redis simple|redis fair|redis default|zk|etcd", u, "|")
    for (i = 1; i <= n; i++)
        row(1, "pair rate / raw floor, " u[i], u[i] in unc,
            sprintf("%.2fx", unc[u[i]]), ">= 0.95x", unc[u[i]] >= 0.95)
    row(2, "hand-off p50 (8 waiters), redis fair", "redis fair" in rt,
        sprintf("%.2f RT", rt["redis fair"]), "<= 1.2 RT", rt["redis fair"] <= 1.2)
    n = split("zk|etcd", h, "|")
    for (i = 1; i <= n; i++)
        row(2, "hand-off p50 (8 waiters), " h[i], h[i] in rt, sprintf("%.2f RT", rt[h[i]]),
            "<= 1.5 RT", rt[h[i]] <= 1.5)
    n = split("redis default|zk", p, "|")
    for (i = 1; i <= n; i++) {
        have = nheld[p[i]] && npeer[p[i]] && peer[p[i]] > 0
        x = have ? (held[p[i]] / nheld[p[i]]) / (peer[p[i]] / npeer[p[i]]) : 0
        row(3, "contended (4, 0.5 ms) / peer, " (p[i] == "zk" ? "zk" : "redis"), have,
            sprintf("%.2fx", x), ">= 2x", x >= 2)
    }
    row(4, "redlock pair p50 / parallel floor", redlock > 0,
        sprintf("%.2fx", redlock), "<= 1.2x", redlock <= 1.2)
    n = split("redis default|etcd|zk", r, "|")
    for (i = 1; i <= n; i++)
        row(5, "renewal CPU/lock/period, " r[i], r[i] in cpu,
            sprintf("%.2f us", cpu[r[i]]) (lost[r[i]] ? sprintf(" (%d lost)", lost[r[i]]) : ""),
            "<= 5 us", cpu[r[i]] <= 5 && lost[r[i]] == 0)
    row(6, "file hand-off median / flock(2)", file > 0, sprintf("%.2fx", file), "<= 2x",
        file <= 2)
    # Issue 25 (the SQL backends) asks 0.8x of the raw floor, and the
    # hand-off reported in round trips with no goal of its own.
    n = split("postgres|mysql", q, "|")
    for (i = 1; i <= n; i++) {
        row(25, "pair rate / raw floor, " q[i], q[i] in unc, sprintf("%.2fx", unc[q[i]]),
            ">= 0.8x", unc[q[i]] >= 0.8)
        printf "%-2s %-40s %-14s %-10s %s\n", 25, "hand-off p50 (8 waiters), " q[i],
               q[i] in rt ? sprintf("%.2f RT", rt[q[i]]) : "-", "(report)", "-"
    }
}' "$log"
