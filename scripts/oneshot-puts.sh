#!/usr/bin/env bash
# One-shot clients on a small cluster (issue "safe whatever a process does", §5):
# 6 batches of 40 concurrent `swarm put` processes on a 64 MiB cluster with 8 writer
# ids, each batch timed, its failures counted, then `swarm stat`.
#   scripts/oneshot-puts.sh [SWARM_BINARY] [DIR]
#   (defaults: target/release/swarm, a fresh directory under /dev/shm)
set -euo pipefail
bin=${1:-target/release/swarm}
dir=${2:-$(mktemp -d -p /dev/shm)/kv}
rm -rf "$dir"
"$bin" init --dir "$dir" --size 64MiB --writers 8 | tail -1
logs=$(mktemp -d)
for b in 1 2 3 4 5 6; do
    start=$(date +%s.%N)
    for i in $(seq 1 40); do
        ( "$bin" put --dir "$dir" "b${b}k${i}" "v${b}-${i}" >/dev/null 2>"$logs/err.$b.$i"
          echo $? >"$logs/rc.$b.$i" ) &
    done
    wait
    end=$(date +%s.%N)
    failed=0
    for i in $(seq 1 40); do [ "$(cat "$logs/rc.$b.$i")" = 0 ] || failed=$((failed + 1)); done
    printf "batch %d: %.2f s, %d of 40 failed\n" "$b" "$(echo "$end - $start" | bc)" "$failed"
    if [ "$failed" -gt 0 ]; then
        for i in $(seq 1 40); do
            [ "$(cat "$logs/rc.$b.$i")" = 0 ] || { head -c 300 "$logs/err.$b.$i"; echo; break; }
        done
    fi
done
rm -rf "$logs"
"$bin" stat --dir "$dir" | grep -E "^keys|^registers:|register chunks held"
