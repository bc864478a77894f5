#!/usr/bin/env bash
# A soak of SWARM-KV on shared memory (docs/operations.md, "Soak"): client processes
# (`swarm bench`, churn and YCSB A, each in its own key namespace) run against one
# cluster while a nemesis kills and pauses them, loses, corrupts and repairs nodes
# and fills the cluster; then every surviving history is checked with `swarm check`
# and memory in use must stay bounded. The work is done by scripts/soak.py (python3,
# standard library only).
#
#   scripts/soak.sh [--dir D] [--duration 10m] [--clients N] [--nemesis all|none|kill,stop,repair,corrupt,fill]
#                   [--history-keys 300] [--plot DIR] [--seed S] [--swarm PATH] [--keep]
#
# Needs a release build of `swarm` (cargo build --release -p swarm-cli); exits 0 if
# every check passed, 1 otherwise (with the seed and the command to reproduce).
set -euo pipefail
if ! command -v python3 > /dev/null; then
  echo "soak: python3 is needed (standard library only)" >&2
  exit 1
fi
exec python3 "$(dirname "$0")/soak.py" "$@"
