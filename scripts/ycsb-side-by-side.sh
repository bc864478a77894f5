#!/usr/bin/env bash
# Side-by-side YCSB throughput of two builds of `swarm` on shared memory, alternating
# runs on fresh clusters (the measured phase's kops/s, one line per run; with
# PHASE=load, the load phase's: KEYS inserts into an empty store).
#
# Usage: scripts/ycsb-side-by-side.sh OLD_SWARM NEW_SWARM
#   W=a|b (workload, default a)  N=runs of each (5)  CL=clients (2)
#   OPS=measured ops (400000)    KEYS=keys (100000)   INFLIGHT=per client (1)
#   TOUCH=1 (default) writes every page of the fresh node files once before the
#   run (python3), so that first-touch page faults of tmpfs, which otherwise take
#   a large and build-dependent share of a short run, stay out of the comparison;
#   TOUCH=0 leaves them in.
# The two builds take turns going first (ABBA), so that a drift of the host over
# the invocation does not favour either. Prints the mean of each at the end.
# Not a test; the numbers are only comparable within one invocation on a quiet
# machine. Clusters: 1 GiB per node, values up to 128 B, 8 writers (the README's).
set -euo pipefail
old=$1 new=$2
W=${W:-a} N=${N:-5} CL=${CL:-2} OPS=${OPS:-400000} KEYS=${KEYS:-100000} TOUCH=${TOUCH:-1}
INFLIGHT=${INFLIGHT:-1} PHASE=${PHASE:-measured}
touch_pages() {
    python3 - "$@" <<'PY'
import mmap, os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED)
    for offset in range(0, len(m), 4096):
        m[offset] = m[offset]
    m.close()
    os.close(fd)
PY
}
run() { # LABEL BINARY
    local dir
    dir=$(mktemp -d -p /dev/shm)
    "$2" init --dir "$dir/kv" --size 1GiB --value-max 128 --writers 8 >/dev/null
    if [ "$TOUCH" = 1 ]; then touch_pages "$dir"/kv/node-*; fi
    local rate
    rate=$("$2" bench --dir "$dir/kv" --workload "$W" --keys "$KEYS" --ops "$OPS" \
        --clients "$CL" --inflight "$INFLIGHT" 2>&1 | sed -n "s/^$PHASE .*[:(] *\([0-9.]* [kM]ops\/s\).*/\1/p")
    rm -rf "$dir"
    echo "$W run $i $1 ${rate:-failed}"
}
for i in $(seq "$N"); do
    if [ $((i % 2)) = 1 ]; then
        run old "$old"
        run new "$new"
    else
        run new "$new"
        run old "$old"
    fi
done | while IFS= read -r line; do
    # Each run's line goes to stderr as it comes (not `tee /dev/stderr`, which
    # reopens the file stderr names and truncates it when both streams go there).
    printf '%s\n' "$line" >&2
    printf '%s\n' "$line"
done | awk '$5 != "failed" { sum[$4] += ($6 == "Mops/s" ? 1000 * $5 : $5); n[$4]++ }
    END { for (b in sum) printf "%s mean %.1f kops/s over %d runs\n", b, sum[b] / n[b], n[b] }'
