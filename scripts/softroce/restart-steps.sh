# Steps 7 and 8 of scripts/softroce/test.sh, sourced by its VM script, which
# defines root, target (the cargo target directory), out, swarm, pass, fail, tail_of
# and serving (common.sh).
#
#   7. a memory node restarted empty (kill -9, then started again) while one process
#      keeps making clients of the store it opened before (swarm-kv's
#      examples/client_churn.rs: a new client per round, a put and a get each): the
#      clients made after the restart must leave the node out (their log says it
#      "restarted with empty memory (... this process knew ...)", the cluster
#      handle's pinned incarnation), and the history is checked;
#   8. (`flood_step`) a flood of silent, unauthenticated bootstrap connections
#      against every node (swarm-rdma's examples/bootstrap_flood.rs: 8 loopback
#      source addresses x 8 sockets per node, reopened as closed) while the same kind
#      of process makes clients, with keys of its own (the checker starts every key
#      absent, and step 7 wrote its keys): every client must be made, and the history
#      is checked. The flood runs inside the VM, on the same emulated CPUs as the
#      processes under test: proving the token took honest clients over a second
#      there, which the nodes' pre-authentication deadline used to cut (it now
#      covers the first message only; swarm-rdma/src/bootstrap/server.rs). The
#      flood blocks on its sockets instead of polling them (a remote flood costs
#      the node's host nothing but the node's own work).

restart_step() {
    local churn=$target/debug/examples/client_churn
    local dir p waited churn_pid
    dir=$(mktemp -d)
    $swarm init --rdma 10.0.2.15:7481,10.0.2.15:7482,10.0.2.15:7483 --dir "$dir" >/dev/null
    local conf=$dir/swarm-cluster.conf
    local -a nodes=()
    for p in 7481 7482 7483; do
        RUST_LOG=swarm_rdma=info $swarm memnode --listen 10.0.2.15:$p --size 64MiB --cluster "$conf" \
            >"$out/restart-memnode-$p.log" 2>&1 &
        nodes+=($!)
    done
    for p in 7481 7482 7483; do serving "$out/restart-memnode-$p.log"; done
    # The timings of step 2 (soft-RoCE in the VM holds requests for seconds).
    timeout 120 $swarm format --cluster "$conf" --value-max 64 --writers 16 --max-op 4s --lease 6s \
        --lease-renew 250ms --delivery-margin 2s >"$out/restart-format.log" 2>&1 &&
        pass "format a second cluster" ||
        { fail "format a second cluster (see $out/restart-format.log)"; tail_of "$out/restart-format.log"; }

    # 7. Node 2 restarted empty while one process keeps making clients.
    timeout 900 "$churn" "$conf" 30 "$out/restart-history-restart.jsonl" \
        >"$out/restart-churn-restart.out" 2>"$out/restart-churn-restart.log" &
    churn_pid=$!
    waited=0
    until grep -q '^round 5:' "$out/restart-churn-restart.log" 2>/dev/null || [ $waited -ge 300 ]; do
        sleep 1
        waited=$((waited + 1))
    done
    kill -9 "${nodes[2]}"
    RUST_LOG=swarm_rdma=info $swarm memnode --listen 10.0.2.15:7483 --size 64MiB --cluster "$conf" \
        >"$out/restart-memnode-7483-restarted.log" 2>&1 &
    nodes[2]=$!
    serving "$out/restart-memnode-7483-restarted.log"
    if wait "$churn_pid" && grep -q "this process knew" "$out/restart-churn-restart.log"; then
        pass "clients made after node 2 restarted empty leave it out ($(cat "$out/restart-churn-restart.out"))"
    else
        fail "client churn across a restart (see $out/restart-churn-restart.log)"
        tail_of "$out/restart-churn-restart.log" 20
    fi
    $swarm check "$out/restart-history-restart.jsonl" >"$out/restart-check-restart.log" 2>&1 &&
        pass "history across the restart linearizable" ||
        { fail "history across the restart linearizable (see $out/restart-check-restart.log)"
          tail_of "$out/restart-check-restart.log"; }
    # Node 2 is left out from now on (not repaired): nodes 0 and 1 serve step 8.
    i47_conf=$conf
    i47_nodes=("${nodes[@]}")
}

flood_step() {
    local churn=$target/debug/examples/client_churn
    local flood=$target/debug/examples/bootstrap_flood
    local conf=$i47_conf flood_pid sockets
    local -a nodes=("${i47_nodes[@]}")
    # 8. A bootstrap flood while an honest process makes clients: every one is made.
    #    The flood stops by itself after 15 minutes if the step never kills it.
    timeout 960 "$flood" 900 10.0.2.15:7481 10.0.2.15:7482 10.0.2.15:7483 >"$out/restart-flood.out" 2>&1 &
    flood_pid=$!
    sleep 5
    if timeout 600 "$churn" "$conf" 20 "$out/restart-history-flood.jsonl" flood \
        >"$out/restart-churn-flood.out" 2>"$out/restart-churn-flood.log" &&
        grep -q " 0 could not be made" "$out/restart-churn-flood.out"; then
        # The flood's last report: sockets opened against each node so far.
        sockets=$(grep '^flood:' "$out/restart-flood.out" | tail -3 | sed -n 's/.*: \([0-9]*\) silent sockets.*/\1/p' | paste -sd/)
        pass "honest clients served during a flood ($(cat "$out/restart-churn-flood.out"); flood sockets per node: ${sockets:-none reported})"
    else
        fail "honest clients during a flood (see $out/restart-churn-flood.log)"
        tail_of "$out/restart-churn-flood.log" 20
    fi
    kill "$flood_pid" 2>/dev/null
    wait "$flood_pid" 2>/dev/null
    $swarm check "$out/restart-history-flood.jsonl" >"$out/restart-check-flood.log" 2>&1 &&
        pass "history during the flood linearizable" ||
        { fail "history during the flood linearizable (see $out/restart-check-flood.log)"
          tail_of "$out/restart-check-flood.log"; }
    kill "${nodes[@]}" 2>/dev/null
}
