#!/usr/bin/env bash
# Repeats the soft-RoCE phase's kill step (test.sh step 4) on fresh clusters, with the
# protocol's debug events on, to chase a kill bench that fails. Meant to run INSIDE the
# VM:
#
#   cargo build -p swarm-cli --features rdma
#   scripts/softroce/run-in-vm.sh scripts/softroce/kill-repro.sh
#
# Each round: three memory nodes on fresh ports, `swarm format` as in test.sh, the bench
# of test.sh with node 2 killed after 5 s, its history checked. Runs 4 rounds; stops
# early at a hung bench or a history that is not linearizable (failed operations alone,
# which test.sh tolerates when they are lost majorities, do not stop it). The
# binary is copied first: a build on the host during the run must not swap it under
# the VM's 9p mount. A bench whose log stays silent for 90 s is taken as hung:
# every thread's backtrace (gdb) and the queue pairs' states (`rdma res show qp`) are
# saved, then it is killed. Outputs in target/softroce-kill/.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/target/softroce-kill
rm -rf "$out"; mkdir -p "$out"
cp "$root/target/debug/swarm" "$out/swarm"
swarm=$out/swarm
export RUST_LOG=${RUST_LOG:-info,swarm_core::protocol::maxreg=debug}
. "$root/scripts/softroce/common.sh"
bench=(--workload a --keys 1000 --ops 10000 --clients 2 --warmup-ops 0)
for round in $(seq 1 4); do
    base=$((7400 + round * 10))
    ports=($((base + 1)) $((base + 2)) $((base + 3)))
    dir=$(mktemp -d)
    $swarm init --rdma "10.0.2.15:${ports[0]},10.0.2.15:${ports[1]},10.0.2.15:${ports[2]}" \
        --dir "$dir" >/dev/null
    pids=()
    for port in "${ports[@]}"; do
        $swarm memnode --listen 10.0.2.15:$port --size 64MiB --cluster "$dir/swarm-cluster.conf" \
            >"$out/memnode-$round-$port.log" 2>&1 &
        pids+=($!)
    done
    for port in "${ports[@]}"; do serving "$out/memnode-$round-$port.log"; done
    c=(--cluster "$dir/swarm-cluster.conf")
    timeout 120 $swarm format "${c[@]}" --value-max 64 --writers 8 --max-op 4s --lease 6s \
        --lease-renew 250ms --delivery-margin 2s >"$out/format-$round.log" 2>&1
    start=$(date +%s)
    timeout 600 $swarm bench "${c[@]}" "${bench[@]}" --seed 7 \
        --history "$out/history-$round.jsonl" >"$out/bench-$round.log" 2>&1 &
    bp=$!
    sleep 5
    kill -9 "${pids[2]}"
    log=$out/bench-$round.log
    st=
    while [ -z "$st" ]; do
        sleep 5
        if ! kill -0 $bp 2>/dev/null; then wait $bp; st=$?; break; fi
        if [ $(( $(date +%s) - $(stat -c %Y "$log") )) -ge 90 ]; then
            pid=$(pgrep -P $bp swarm || echo $bp)
            gdb -p "$pid" -batch -ex "thread apply all bt" >"$out/stacks-$round.txt" 2>&1
            rdma res show qp >"$out/qps-$round.txt" 2>&1
            kill -9 "$pid" $bp 2>/dev/null; wait $bp; st=hung
        fi
    done
    $swarm check "$out/history-$round.jsonl" >"$out/check-$round.log" 2>&1; ck=$?
    echo "round $round: bench exit $st after $(($(date +%s) - start)) s, check exit $ck:" \
        "$(grep -v '^ *$' "$out/bench-$round.log" | grep -i -m1 -E 'error|fail' | cut -c1-300)" |
        tee -a "$out/result.txt"
    kill "${pids[@]}" 2>/dev/null
    wait 2>/dev/null
    # Failed operations alone (see test.sh step 4) do not stop the rounds.
    [ "$st" != hung ] && [ $ck -eq 0 ] || break
done
exit 0
