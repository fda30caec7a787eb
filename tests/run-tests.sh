#!/usr/bin/env bash
# run-tests.sh -- runs each test binary given (Check suites, every test in
# its own process with a time limit), shows their output, and ends with the
# one summary line CI reads: "N passed, N failed", after each failed
# test's line again (a log's tail then says which test failed).
# DLOCK_VALGRIND=1 runs every binary under valgrind (children too): memory
# errors fail the run; leaks are reported but left to the LeakSanitizer run
# (make check SAN=1), since test children that _exit() leak by design.
# A fuzz_* binary (tests/fuzz/) runs through tests/fuzz/run-fuzz.sh.
# DLOCK_TEST=<substring or glob of "case/test"> runs only the matching
# tests of every binary (tests/lib/testutil.h), e.g. DLOCK_TEST=cancel.
set -u
passed=0 failed=0 broken=() failures=()
for bin in "$@"; do
  name=$(basename "$bin")
  echo "== $name"
  log=$(mktemp)
  start=$SECONDS
  if [[ $name == fuzz_* ]]; then
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
  rc=$?
  cat "$log"
  echo "-- $name: $((SECONDS - start)) s"
  # Check prints: "NN%: Checks: T, Failures: F, Errors: E"
  line=$(grep -E '^[0-9]+%: Checks: [0-9]+' "$log" | tail -1)
  # Check's line for a failed test: "file:line:F:case:test:0: message"
  mapfile -t -O ${#failures[@]} failures < <(grep -E '^[^ ]+:[0-9]+:[FE]:' "$log")
  rm -f "$log"
  if [ -z "$line" ]; then
    echo "!! $name: no Check summary (exit $rc)"
    failed=$((failed + 1)); broken+=("$name"); continue
  fi
  t=$(sed -E 's/.*Checks: ([0-9]+).*/\1/' <<<"$line")
  f=$(sed -E 's/.*Failures: ([0-9]+).*/\1/' <<<"$line")
  e=$(sed -E 's/.*Errors: ([0-9]+).*/\1/' <<<"$line")
  passed=$((passed + t - f - e)); failed=$((failed + f + e))
  if [ "$rc" -ne 0 ] && [ $((f + e)) -eq 0 ]; then
    echo "!! $name: exit $rc although every check passed (valgrind or sanitizer error?)"
    failed=$((failed + 1)); broken+=("$name")
  fi
  [ $((f + e)) -gt 0 ] && broken+=("$name")
done
# the failures again at the end, where a log's tail shows them
for f in "${failures[@]}"; do echo "failed: $f"; done
[ ${#broken[@]} -gt 0 ] && echo "failing binaries: ${broken[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
