#!/usr/bin/env bash
# run-fuzz.sh -- runs one libFuzzer target of tests/fuzz/ the way CI does:
# a fixed seed and a fixed number of inputs (FUZZ_RUNS, default 200000),
# starting from a copy of its corpus (tests/fuzz/corpus/NAME without the
# "fuzz_" prefix), so the tree is left alone. With FUZZ_SECONDS it runs
# that long instead (make fuzz). It ends with a line in Check's format,
# "100%: Checks: 1, Failures: 0, Errors: 0", which tests/run-tests.sh
# counts; a crash leaves its input in build-fuzz/crashes/ to turn into a
# regression test.
set -u
bin=$1
name=$(basename "$bin")
corpus=$(dirname "$0")/corpus/${name#fuzz_}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -d "$corpus" ] && cp -r "$corpus"/. "$work"/
crashes=$(dirname "$bin")/../../crashes
mkdir -p "$crashes"
if [ -n "${FUZZ_SECONDS:-}" ]; then
  limit=(-max_total_time="$FUZZ_SECONDS")
else
  limit=(-seed=13 -runs="${FUZZ_RUNS:-200000}")
fi
"$bin" "${limit[@]}" -max_len=1024 -artifact_prefix="$crashes/$name-" "$work"
rc=$?
if [ $rc -eq 0 ]; then
  echo "100%: Checks: 1, Failures: 0, Errors: 0"
else
  echo "$name: exit $rc; the input is in $crashes/"
  echo "0%: Checks: 1, Failures: 1, Errors: 0"
fi
exit $rc
