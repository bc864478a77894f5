#!/usr/bin/env bash
# How long the first `swarm put` takes when it must take over the writer id of a
# client that was SIGKILLed (no sealed log summary), then two more puts.
#
# Usage: scripts/crash-resume-timing.sh SWARM_BINARY [DIR]
# The cluster (1 GiB per node, values up to 128 B, 2 writers) is created in DIR
# (default: a fresh directory under /dev/shm) and removed afterwards. A 2-client
# update bench is killed after 6 s, both writer ids are evicted (so the puts need
# not wait for the leases to expire), and the puts are timed.
# Not a test: the numbers depend on the machine.
set -euo pipefail
bin=$1
if [ $# -ge 2 ]; then dir=$2; scratch=; else scratch=$(mktemp -d -p /dev/shm); dir=$scratch/kv; fi
rm -rf "$dir"
"$bin" init --dir "$dir" --size 1GiB --value-max 128 --writers 2 >/dev/null
"$bin" bench --dir "$dir" --workload u --keys 10000 --duration 60s --clients 2 >/dev/null 2>&1 &
bench=$!
sleep 6
kill -9 "$bench"
wait "$bench" 2>/dev/null || true
for w in 0 1; do "$bin" evict --dir "$dir" --writer "$w" >/dev/null; done
for n in 1 2 3; do
    start=$(date +%s%N)
    "$bin" put --dir "$dir" "key$n" "v$n" >/dev/null
    end=$(date +%s%N)
    echo "put $n after the crash: $(( (end - start) / 1000000 )) ms"
done
test "$("$bin" get --dir "$dir" key1)" = v1
rm -rf "$dir" ${scratch:+"$scratch"}
