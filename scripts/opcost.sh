#!/usr/bin/env bash
# Instructions per operation of the fabric and protocol hot paths, from callgrind
# (benches/examples/opcost.rs): robust on a loaded host, unlike wall-clock timings.
#   scripts/opcost.sh [read-node read-roundtrip raw-read raw-write sg-read sg-write kv-get kv-update]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p swarm-benches --example opcost
bin=target/release/examples/opcost
ops=("$@")
[ ${#ops[@]} -eq 0 ] && ops=(read-node read-roundtrip raw-read raw-write sg-read sg-write kv-get kv-update)
total() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
for op in "${ops[@]}"; do
    a=$(total "$op" 1000)
    b=$(total "$op" 3000)
    echo "$op $(( (b - a) / 2000 )) instructions/op"
done
