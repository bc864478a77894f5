#!/usr/bin/env bash
# Instructions per operation of the fabric and protocol hot paths, from callgrind
# (benches/examples/opcost.rs): robust on a loaded host, unlike wall-clock timings.
#   scripts/opcost.sh [--check] [--bin PATH] [read-node read-roundtrip raw-read raw-write sg-read sg-read-into sg-write kv-get kv-update]
# With --check, each operation is compared with its budget in scripts/opcost-budget.txt
# (`operation max-instructions` per line) and the script exits with status 1 if any
# exceeds its budget by more than 3%. --bin runs a given opcost binary instead of
# building one (to count an older build). Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
bin=
ops=()
while [ $# -gt 0 ]; do
    case "$1" in
    --check) check=1 ;;
    --bin) bin=$2; shift ;;
    *) ops+=("$1") ;;
    esac
    shift
done
if [ -z "$bin" ]; then
    cargo build --release -q -p swarm-benches --example opcost
    bin=${CARGO_TARGET_DIR:-target}/release/examples/opcost
fi
budget_file=scripts/opcost-budget.txt
[ ${#ops[@]} -eq 0 ] && ops=(read-node read-roundtrip raw-read raw-write sg-read sg-read-into sg-write kv-get kv-update)
total() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
over=0
for op in "${ops[@]}"; do
    a=$(total "$op" 1000)
    b=$(total "$op" 3000)
    count=$(((b - a) / 2000))
    if [ "$check" = 1 ]; then
        budget=$(awk -v op="$op" '$1 == op {print $2}' "$budget_file")
        if [ -z "$budget" ]; then
            echo "$op $count instructions/op: no budget in $budget_file"
            over=1
        elif [ $((count * 100)) -gt $((budget * 103)) ]; then
            echo "$op $count instructions/op: OVER its budget of $budget by more than 3%"
            over=1
        else
            echo "$op $count instructions/op (budget $budget)"
        fi
    else
        echo "$op $count instructions/op"
    fi
done
exit "$over"
