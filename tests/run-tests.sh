#!/usr/bin/env bash
# run-tests.sh -- runs each test binary given (Check suites, every test in
# its own process with a time limit), shows their output, and ends with the
# one summary line CI reads: "N passed, N failed", after each failed
# test's line again (a log's tail then says which test failed). Each
# binary's "-- NAME: N s" line names its three longest tests (from Check's
# XML log), and a line above the summary gives every binary's time,
# longest first: where a run's time goes.
#
# A test that fails is run once more, alone (DLOCK_TEST=its name). The
# suites start real servers and kill, pause and partition them on a shared
# 2-core machine, so a rare failure may be the machine, not the code, and
# one such failure would throw away a whole CI run. A test that fails and
# then passes alone counts as passed but is named on a "flaky:" line before
# the summary, to be read and fixed; a test that fails again counts as
# failed. DLOCK_NO_RERUN=1 turns the second run off (for hunting flakes).
#
# DLOCK_VALGRIND=1 runs every binary under valgrind (children too): memory
# errors fail the run; leaks are reported but left to the LeakSanitizer run
# (make check SAN=1), since test children that _exit() leak by design.
# A fuzz_* binary (tests/fuzz/) runs through tests/fuzz/run-fuzz.sh.
# DLOCK_TEST=<substring or glob of "case/test"> runs only the matching
# tests of every binary (tests/lib/testutil.h), e.g. DLOCK_TEST=cancel.
# DLOCK_JOBS=N runs N binaries at a time (make check: 2). The suites wait
# far more than they compute (servers stopped, leases run out), so two at
# a time take about 40 % less time on 2 cores; each binary's servers,
# ports and directories are its own.
set -u
passed=0 failed=0 broken=() failures=() flaky=() times=()

# run_bin BIN LOG: runs one binary (its way) with its output in LOG
run_bin() {
  local bin=$1 log=$2
  if [[ $(basename "$bin") == fuzz_* ]]; then
    # a libFuzzer target: a fixed run that prints a Check-style summary
    "$(dirname "$0")/fuzz/run-fuzz.sh" "$bin" >"$log" 2>&1
  elif [ "${DLOCK_VALGRIND:-}" = 1 ]; then
    CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-10} valgrind -q --trace-children=yes \
      --trace-children-skip='*redis-server*,*etcd*,*java*,*zkServer*,/bin/*,/usr/bin/*' \
      --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=none \
      "$bin" >"$log" 2>&1
  else
    "$bin" >"$log" 2>&1
  fi
}

# slowest XML: the three longest tests of Check's XML log, "case/test N.N s"
slowest() {
  [ -s "$1" ] || return 0
  awk -F'[<>]' '/<id>/ { id = $3 } /<duration>/ { d = $3 }
    /<description>/ { printf "%.1f %s/%s\n", d, $3, id }' "$1" |
    sort -rn | head -3 | awk '{ printf "%s%s %s s", (NR > 1 ? ", " : ""), $2, $1 }'
}

# summary LOG: Check's "NN%: Checks: T, Failures: F, Errors: E" as "T F E"
summary() {
  grep -E '^[0-9]+%: Checks: [0-9]+' "$1" | tail -1 |
    sed -E 's/.*Checks: ([0-9]+), Failures: ([0-9]+), Errors: ([0-9]+).*/\1 \2 \3/'
}

# Every binary runs first, DLOCK_JOBS of them at a time (default 1), each
# into files of its own under $work; then each is shown and counted in
# the order given, and a failed test is run again alone -- after every
# binary ended, so nothing else runs beside it.
jobs=${DLOCK_JOBS:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bins=("$@")
run_one() {
  local i=$1 start=$SECONDS
  CK_XML_LOG_FILE_NAME=${CK_XML_LOG_FILE_NAME:-$work/$i.xml} run_bin "${bins[$i]}" "$work/$i.log"
  echo $? >"$work/$i.rc"
  echo $((SECONDS - start)) >"$work/$i.took"
}
running=0
for i in "${!bins[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
  run_one "$i" &
  running=$((running + 1))
done
wait

for i in "${!bins[@]}"; do
  bin=${bins[$i]} name=$(basename "${bins[$i]}") log=$work/$i.log
  echo "== $name"
  cat "$log"
  rc=$(cat "$work/$i.rc") took=$(cat "$work/$i.took") top=$(slowest "$work/$i.xml")
  echo "-- $name: $took s${top:+ (slowest: $top)}"
  times+=("$took $name")
  read -r t f e <<<"$(summary "$log")"
  # Check's line for a failed test: "file:line:F:case:test:0: message"
  mapfile -t lost < <(grep -E '^[^ ]+:[0-9]+:[FE]:' "$log")
  if [ -z "${t:-}" ]; then
    echo "!! $name: no Check summary (exit $rc)"
    failed=$((failed + 1)); broken+=("$name"); continue
  fi
  passed=$((passed + t - f - e))
  if [ "$rc" -ne 0 ] && [ $((f + e)) -eq 0 ]; then
    echo "!! $name: exit $rc although every check passed (valgrind or sanitizer error?)"
    failed=$((failed + 1)); broken+=("$name")
  fi
  [ $((f + e)) -eq 0 ] && continue
  [[ " ${broken[*]} " == *" $name "* ]] || broken+=("$name")
  # a fuzz target's failure, or one Check could not name, is not rerun
  if [[ $name == fuzz_* ]] || [ "${DLOCK_NO_RERUN:-}" = 1 ] || [ ${#lost[@]} -ne $((f + e)) ]; then
    failed=$((failed + f + e)); failures+=("${lost[@]}"); continue
  fi
  again_failed=0
  for line in "${lost[@]}"; do
    IFS=: read -r _ _ _ tcase test _ <<<"$line"
    echo "== $name: $tcase/$test failed; once more, alone"
    log=$work/again.log
    DLOCK_TEST="$tcase/$test" run_bin "$bin" "$log"
    cat "$log"
    read -r t2 f2 e2 <<<"$(summary "$log")"
    if [ "${t2:-0}" -gt 0 ] && [ $((f2 + e2)) -eq 0 ]; then
      passed=$((passed + 1)); flaky+=("$name $tcase/$test -- $line")
    else
      failed=$((failed + 1)); failures+=("$line"); again_failed=1
    fi
  done
  [ $again_failed = 1 ] || unset 'broken[-1]'
done
# where the time went, then the failures again, where a log's tail shows them
[ ${#times[@]} -gt 1 ] &&
  echo "time per binary: $(printf '%s\n' "${times[@]}" | sort -rn | awk '{ printf "%s%s %s s", (NR > 1 ? ", " : ""), $2, $1 }')"
echo "ran in $SECONDS s, $jobs binaries at a time"
for f in "${flaky[@]}"; do echo "flaky (failed, then passed alone): $f"; done
for f in "${failures[@]}"; do echo "failed: $f"; done
[ ${#broken[@]} -gt 0 ] && echo "failing binaries: ${broken[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
