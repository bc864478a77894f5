#!/usr/bin/env bash
# Reproduces the soft-RoCE phase's first bench under debug logs, to chase a hang seen
# under CPU load (a bench client stops making progress with no warning). Meant to run
# INSIDE the VM, with a busy loop beside it on the host:
#
#   cargo build -p swarm-cli --features rdma
#   bash -c 'while :; do :; done' & busy=$!
#   scripts/softroce/run-in-vm.sh scripts/softroce/hang-repro.sh; kill $busy
#
# Three memory nodes, `swarm format` as in test.sh, then up to three runs of test.sh's
# first bench with RUST_LOG=swarm_kv=debug,swarm_rdma=debug,swarm_core=debug. A run
# still going after 600 polls of one second is taken as hung: the bench's threads
# (state, utime, stime, wchan; twice, 5 s apart), its sockets and every queue pair's
# state (`rdma res show qp`) are saved, then it is killed. Outputs in
# target/softroce-hang/ (result.txt, bench-N.log, threads-N.txt, qps-N.txt). Under a
# loaded VM a slow bench can also run out of polls: check that its log stopped long
# before it was killed.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/target/softroce-hang
rm -rf "$out"; mkdir -p "$out"
swarm=$root/target/debug/swarm
export RUST_LOG=swarm_kv=debug,swarm_rdma=debug,swarm_core=debug
. "$root/scripts/softroce/common.sh"
snapshot() {
    for t in /proc/$1/task/*; do
        echo "$t $(cat "$t/comm") $(cut -d' ' -f3,14,15 "$t/stat") wchan=$(cat "$t/wchan" 2>/dev/null)"
    done
}
dir=$(mktemp -d)
$swarm init --rdma 10.0.2.15:7471,10.0.2.15:7472,10.0.2.15:7473 --dir "$dir" >/dev/null
pids=()
for port in 7471 7472 7473; do
    $swarm memnode --listen 10.0.2.15:$port --size 64MiB --cluster "$dir/swarm-cluster.conf" \
        >"$out/memnode-$port.log" 2>&1 &
    pids+=($!)
done
for port in 7471 7472 7473; do serving "$out/memnode-$port.log"; done
c=(--cluster "$dir/swarm-cluster.conf")
timeout 120 $swarm format "${c[@]}" --value-max 64 --writers 8 --max-op 4s --lease 6s \
    --lease-renew 250ms --delivery-margin 2s >"$out/format.log" 2>&1
echo "format: $?" | tee "$out/result.txt"
bench=(--workload a --keys 1000 --ops 10000 --clients 2 --warmup-ops 0)
for i in 1 2 3; do
    start=$(date +%s)
    $swarm bench "${c[@]}" "${bench[@]}" --seed "$i" --history "$out/history-$i.jsonl" \
        >"$out/bench-$i.log" 2>&1 &
    bp=$!
    st=124
    for _ in $(seq 1 600); do
        if ! kill -0 $bp 2>/dev/null; then wait $bp; st=$?; break; fi
        sleep 1
    done
    echo "bench $i: exit $st after $(($(date +%s) - start)) s" | tee -a "$out/result.txt"
    if [ $st -eq 124 ]; then
        { snapshot $bp; sleep 5; snapshot $bp; } >"$out/threads-$i.txt" 2>&1
        ss -tanp >"$out/sockets-$i.txt" 2>&1
        rdma res show qp >"$out/qps-$i.txt" 2>&1
        kill -9 $bp
        echo "HANG? bench $i killed; its log ends at: $(tail -1 "$out/bench-$i.log" | cut -c1-40)" |
            tee -a "$out/result.txt"
        break
    fi
done
kill "${pids[@]}" 2>/dev/null
exit 0
