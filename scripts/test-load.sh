#!/usr/bin/env bash
# make test-load: every test of `make test`, RUNS times in a row (5 by default), while a CPU
# hog keeps every core busy beside it. It passes only when every run passes: a test that
# reads the wall clock for an age, a grace period or a timeout shows up here.
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${RUNS:-5}"
hogs=()
for _ in $(seq "$(nproc)"); do
    ( while :; do :; done ) &
    hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
echo "test-load: $runs runs beside $(nproc) busy loops"
passed=0
for i in $(seq "$runs"); do
    mkdir -p test-output; start=$(date +%s)
    if make --no-print-directory checks >"test-output/load-run-$i.log" 2>&1; then
        passed=$((passed + 1)); verdict=passed
    else
        verdict="FAILED (test-output/load-run-$i.log)"
    fi
    echo "run $i/$runs: $verdict in $(( $(date +%s) - start )) s"
done
echo "test-load: $passed/$runs runs passed"
[ "$passed" -eq "$runs" ]
