#!/usr/bin/env bash
# Mutation testing of the protocol against the randomized simulation (and
# swarm-kv's recycling tests).
#
# Applies each mutant of scripts/mutants/*.patch (one deliberate bug in
# swarm-core/src/protocol, or in swarm-kv's delete, repair, index and register
# recycling, per file) in turn, runs ONLY the randomized tests
# (swarm-sim/tests/sim_protocol.rs, sim_max_register_race.rs,
# sim_slow_path_race.rs, sim_inflight_race.rs, sim_recycling.rs,
# sim_crash_resume.rs; not the scripted schedules of swarm-sim) plus
# swarm-kv/tests/recycle.rs (randomized churns and a few scripted register-reuse
# schedules, under a second) and the KV's randomized histories with deletes
# (repair_sim.rs, kv_semantics.rs, deferred_unmap.rs, delete_race_sim.rs), and the index's randomized
# histories (index_sim.rs, for the index-* mutants of its fast round), at their
# default CI seed counts, reverts the mutant, and prints a table: `caught` (a test
# failed), `MISSED` (every test passed: these tests cannot see this bug),
# `unviable` (it does not compile) or `stale` (the patch no longer applies: refresh
# it against the current code).
#
# A patch that starts with a line `# tests: CARGO-TEST-ARGS` (before its diff, which
# git apply skips to) is run against those tests instead: a mutant of the RDMA
# transport, which only the emulated-RDMA tests reach.
#
# Usage: scripts/mutants.sh [NAME ...]   (names without .patch; default: all)
#   MUTANTS_TEST_ARGS="--skip TEST" passes arguments to the test binaries.
# Mutants are applied in a temporary worktree of HEAD (target/mutants/tree), so the
# checkout is never touched. Logs go to target/mutants/NAME.log. Not run in CI:
# most mutants take under a minute once built; a mutant whose histories the
# linearizability checker is slow to refute may run up to the 20-minute timeout.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
cd "$root"
if ! git diff --quiet HEAD -- swarm-core/src; then
    echo "note: swarm-core/src has uncommitted changes; the mutants apply to HEAD, not to them" >&2
fi
logs=$root/target/mutants
mkdir -p "$logs"
# Mutants are applied in a throw-away worktree of HEAD, never in this checkout: a
# commit made while the script runs must not be able to pick a mutant up.
tree=$logs/tree
git worktree remove --force "$tree" >/dev/null 2>&1 || true
git worktree add --detach "$tree" HEAD >/dev/null
# A target directory of its own: cargo's artifact hashes do not depend on the source
# path, so sharing the checkout's would let the mutated tree's fingerprints (which name
# the tree's files) stand for the checkout's crates, and a later build in the checkout
# would link a stale or mutated swarm-core without noticing.
export CARGO_TARGET_DIR=$logs/target
cd "$tree"
# The CI seed counts, not a soak and not a single replay.
unset SWARM_SIM_SEED SWARM_SIM_SEEDS
# Plus swarm-kv's recycling tests: the simulation never reuses a register, and a
# race of reclaim checks with register reuse only shows there (seed 108 of the
# churn replays it).
test_cmd=(cargo test -q --no-fail-fast -p swarm-sim --test sim_protocol --test sim_max_register_race --test sim_slow_path_race --test sim_inflight_race --test sim_recycling --test sim_crash_resume -p swarm-kv --test recycle --test repair_sim --test kv_semantics --test deferred_unmap --test delete_race_sim --test index_sim)
applied=""
restore() {
    if [ -n "$applied" ]; then
        git apply -R "$applied"
        applied=""
    fi
}
cleanup() {
    restore
    cd "$root"
    git worktree remove --force "$tree" >/dev/null 2>&1 || true
}
# On a signal, clean up and stop: a handler that returned would let the loop go on
# in the checkout (cleanup leaves the removed worktree) and mutate it.
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ $# -gt 0 ]; then
    patches=()
    for name in "$@"; do patches+=("$root/scripts/mutants/$name.patch"); done
else
    patches=("$root"/scripts/mutants/*.patch)
fi

build_cmd=("${test_cmd[@]}" --no-run)
# Extra arguments for the test binaries, e.g. MUTANTS_TEST_ARGS="--skip NAME".
read -r -a extra <<<"${MUTANTS_TEST_ARGS:-}"
test_cmd+=(-- "${extra[@]}")

echo "Running the unmutated tests first..."
if ! "${test_cmd[@]}" >"$logs/unmutated.log" 2>&1; then
    echo "the unmutated tests fail (see $logs/unmutated.log): every mutant would look caught" >&2
    exit 2
fi

printf '| %-42s | %-8s | %7s | %s\n' mutant result seconds "first failure"
printf '|%s|%s|%s|%s\n' "--------------------------------------------" ---------- --------- ---------------
caught=0
total=0
for patch in "${patches[@]}"; do
    name=$(basename "$patch" .patch)
    log="$logs/$name.log"
    total=$((total + 1))
    if ! git apply --check "$patch" 2>"$log"; then
        printf '| %-42s | %-8s | %7s | %s\n' "$name" stale - "patch does not apply"
        continue
    fi
    git apply "$patch"
    applied=$patch
    start=$(date +%s)
    # A mutant the randomized suite cannot reach (the RDMA transport's) names the
    # tests that kill it on a line `# tests: CARGO-TEST-ARGS` before its diff.
    own=$(sed -n 's/^# tests: //p' "$patch")
    if [ -n "$own" ]; then
        read -r -a own_args <<<"$own"
        mutant_test=(cargo test -q --no-fail-fast "${own_args[@]}")
        # The build takes cargo's arguments only: test filters after a `--` would
        # go to the test binaries, and `--no-run` after them too.
        cargo_args=()
        for arg in "${own_args[@]}"; do
            [ "$arg" = "--" ] && break
            cargo_args+=("$arg")
        done
        mutant_build=(cargo test -q --no-fail-fast --no-run "${cargo_args[@]}")
    else
        mutant_test=("${test_cmd[@]}")
        mutant_build=("${build_cmd[@]}")
    fi
    if ! "${mutant_build[@]}" >>"$log" 2>&1; then
        result=unviable
        detail="does not compile"
    elif timeout 1200 "${mutant_test[@]}" >>"$log" 2>&1; then
        result=MISSED
        detail="all randomized tests passed"
    else
        result=caught
        caught=$((caught + 1))
        tests=$(grep -c ' --- FAILED$' "$log" || true)
        failed=$(grep -m1 -o '^[a-z0-9_]* --- FAILED$' "$log" | sed 's/ --- FAILED//' || true)
        seed=$(grep -m1 -o 'SWARM_SIM_SEED=[0-9]*' "$log" || true)
        detail="${tests} test(s) failed; first: ${failed:-timeout} ${seed}"
    fi
    secs=$(($(date +%s) - start))
    restore
    printf '| %-42s | %-8s | %7s | %s\n' "$name" "$result" "$secs" "$detail"
done
echo
echo "caught $caught of $total mutants (logs in $logs/)"
