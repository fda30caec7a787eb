#!/usr/bin/env bash
# recipes.sh -- runs the recipes of docs/recipes.md as written (check_cli
# recipes_run_as_written): each block after a "<!-- recipe: NAME -->" line
# is taken from the document, only the URL (a file:// directory of this
# run), the path of dlock ($DLOCK_BIN) and of the programs it starts (stubs
# that leave a mark) changed. systemd units pass `systemd-analyze verify`.
# Prints "recipe NAME: ok" per recipe; exits 1 at the first that fails.
set -u
doc=${1:-docs/recipes.md}
dlock=${DLOCK_BIN:?DLOCK_BIN names the dlock to test}
tmp=$(mktemp -d) || exit 1
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
export DLOCK_URL="file://$tmp/locks" DLOCK_CONFIG=
mkdir "$tmp/locks"

fail() { echo "recipe $1: FAILED: $2" >&2; exit 1; }

# recipe NAME: the text of the fenced block after "<!-- recipe: NAME -->"
recipe() {
  awk -v want="<!-- recipe: $1 -->" '
    $0 == want { found = 1; next }
    found && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }' "$doc"
}

# stub NAME: a program that appends a line to $tmp/NAME.out, then waits
# (a service) or exits (a job) as $2 says
stub() {
  printf '#!/bin/sh\necho "$0 $*" >> %s/%s.out\n%s\n' "$tmp" "$1" "${2:-exit 0}" > "$tmp/$1"
  chmod +x "$tmp/$1"
}

# wait_for FILE: until FILE exists (20 s at most)
wait_for() {
  for _ in $(seq 200); do [ -e "$1" ] && return 0; sleep 0.1; done
  return 1
}

# as_here TEXT: the recipe's paths and URLs made this run's
as_here() {
  sed -E -e "s|/usr/local/bin/dlock|$dlock|g" -e "s#(^|[ (])dlock #\\1$dlock #g" \
      -e "s|\"dlock\"|\"$dlock\"|" \
      -e "s|redis://locks.internal:6379|$DLOCK_URL|g" \
      -e "s|etcd://[a-z0-9.]*:2379|$DLOCK_URL|g" \
      -e "s|/usr/local/bin/report|$tmp/report|g" \
      -e "s|/usr/local/bin/scheduler|$tmp/scheduler|g" \
      -e "s|\"/controller\"|\"$tmp/controller\"|"
}

# --- crontab: once per night across hosts
text=$(recipe crontab | as_here)
[ -n "$text" ] || fail crontab "no such block in $doc"
cmd=$(printf '%s\n' "$text" | grep -v '^#' | grep -v '^[A-Z_]*=' | awk 'NF { $1=$2=$3=$4=$5=""; print }')
stub report
bash -c "exec $cmd" & first=$!; pids+=("$first")
wait_for "$tmp/report.out" || fail crontab "the first host never ran the report"
bash -c "exec $cmd" || fail crontab "the second host exited $? (want 0: busy, silent)"
[ "$(wc -l < "$tmp/report.out")" = 1 ] || fail crontab "the report ran twice"
kill -TERM "$first"; wait "$first"; rc=$?
[ $rc = 0 ] || fail crontab "the first host exited $rc after SIGTERM during --min-hold"
echo "recipe crontab: ok"

# --- systemd units: verified
mkdir "$tmp/units"
stub scheduler 'exec sleep 300'
for unit in nightly-report.service nightly-report.timer scheduler.service; do
  recipe "$unit" | as_here > "$tmp/units/$unit"
  [ -s "$tmp/units/$unit" ] || fail "$unit" "no such block in $doc"
done
out=$(cd "$tmp/units" && systemd-analyze verify --man=no ./*.service ./*.timer 2>&1) ||
  fail units "systemd-analyze verify: $out"
echo "recipe nightly-report.service, nightly-report.timer, scheduler.service: verified"

# --- the elected service: its ExecStart leads and runs the scheduler
exec_start=$(sed -n 's/^ExecStart=//p' "$tmp/units/scheduler.service" | sed "s/%H/$(hostname)/")
bash -c "exec $exec_start" & leader=$!; pids+=("$leader")
wait_for "$tmp/scheduler.out" || fail scheduler.service "the scheduler never started"
"$dlock" leader scheduler | grep -q "value=$(hostname):8080" ||
  fail scheduler.service "dlock leader does not show $(hostname):8080"
kill -TERM "$leader"; wait "$leader"
echo "recipe scheduler.service: ok"

# --- the deploy script: steps under the lock, released after
recipe deploy.sh | as_here > "$tmp/deploy.sh"
(cd "$tmp" && stub step1 && stub step2 && setsid -w bash ./deploy.sh > deploy.log 2>&1) ||
  fail deploy.sh "exited $?: $(cat "$tmp/deploy.log")"
[ -e "$tmp/step2.out" ] || fail deploy.sh "step2 never ran"
grep -q 'deploying under the lock: token=' "$tmp/deploy.log" || fail deploy.sh "no hold line"
"$dlock" run -n deploy true || fail deploy.sh "the lock is still held after the script"
echo "recipe deploy.sh: ok"

# --- the pod's command: a JSON array, run as the container would
line=$(recipe pod-command | as_here | sed -n 's/^command: \[\(.*\)\]$/\1/p')
[ -n "$line" ] || fail pod-command "no command: [...] line"
args=()
while IFS= read -r a; do args+=("$a"); done < <(printf '%s\n' "$line" | sed 's/^"//; s/"$//; s/", "/\n/g')
for i in "${!args[@]}"; do
  case ${args[$i]} in
    -u) args[$((i + 1))]=$DLOCK_URL ;;           # the URL named in the recipe: ours
    '$(POD_NAME)') args[$i]=pod-1 ;;             # Kubernetes expands it from the env
  esac
done
stub controller 'exec sleep 300'
"${args[@]}" & pod=$!; pids+=("$pod")
wait_for "$tmp/controller.out" || fail pod-command "the controller never started"
"$dlock" leader my-controller | grep -q 'value=pod-1' || fail pod-command "leader is not pod-1"
kill -TERM "$pod"; wait "$pod"
echo "recipe pod-command: ok"
