#!/usr/bin/env python3
"""Mutation check of the FUSEE baseline (swarm-fusee) against its randomized simulation.

Applies each mutant below (one deliberate bug, as a text substitution) in turn, runs
`cargo test -p swarm-fusee --test sim_fusee`, restores the file, and prints `caught` or
`MISSED`. Usage: scripts/fusee-mutants.py [NAME ...]. Not run in CI (a few seconds each).

All listed mutants but one are caught at the default seed counts (raised until they
were: `interrupted-round-claims-victory` needed ~500 seeds of node and client crashes,
`installed-value-forgotten` ~1500). MISSED: `master-skips-drain` (the master not
waiting for client steps in flight before it reads and repairs the slot copies): a
step would have to land during the repair's read, which the random crashes do not
produce even in 3000 seeds; the drain stays, argued in `master.rs`. Two mutants of rule 3 are equivalent with
two backups and are not listed: the smallest value winning is a convention (the largest
would do), and with every writer's CASes back before it evaluates, the snapshot cannot
change under it, so rule 3's extra primary read never decides anything there.
"""
import shutil, subprocess, sys, os

os.chdir(subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip())
muts = {
 "delete-never-retries": ("swarm-fusee/src/client.rs", "if mode == Mode::Delete && !winner_deleted {", "if false && mode == Mode::Delete && !winner_deleted {"),
 "rule2-half-is-majority": ("swarm-fusee/src/rules.rs", "if 2 * cnt_maj > values.len() {", "if 2 * cnt_maj >= values.len() {"),
 "insert-ignores-foreign-winner": ("swarm-fusee/src/client.rs", "if object.key != key {\n                        trace!", "if object.key == b\"\" {\n                        trace!"),
 "master-skips-drain": ("swarm-fusee/src/master.rs", "while self.active.load(SeqCst) > 0 {", "while false && self.active.load(SeqCst) > 0 {"),
 "update-absent-writes": ("swarm-fusee/src/client.rs", "found.filter(|_| mode == Mode::Insert || !absent)", "found.filter(|_| true)"),
 "interrupted-round-claims-victory": ("swarm-fusee/src/client.rs", "Err(StepError::ViewChanged) => None,", "Err(StepError::ViewChanged) => return Ok(Round::Won),"),
 "failed-round-claims-victory": ("swarm-fusee/src/client.rs", "Err(StepError::Failed(mask)) => Some((mask, None)),", "Err(StepError::Failed(_)) => return Ok(Round::Won),"),
 "installed-value-forgotten": ("swarm-fusee/src/master.rs", ".extend(installed);", ".extend(installed.into_iter().take(0));"),
 "cache-trusts-stale": ("swarm-fusee/src/client.rs", "            if word == c.word {\n                let object", "            if true {\n                let object"),
}
names = sys.argv[1:] or list(muts)
missed = 0
for name in names:
    path, old, new = muts[name]
    src = open(path).read()
    if old not in src:
        print(f"{name:36} stale (refresh the mutant)")
        continue
    shutil.copy(path, path + ".orig")
    try:
        open(path, "w").write(src.replace(old, new, 1))
        r = subprocess.run(["cargo", "test", "-q", "-p", "swarm-fusee", "--test", "sim_fusee"],
                           capture_output=True, text=True)
    finally:
        shutil.move(path + ".orig", path)
        # A fresh mtime, or cargo would keep the mutated build as up to date.
        os.utime(path)
    result = "unviable" if "error[" in r.stderr else ("caught" if r.returncode else "MISSED")
    missed += result == "MISSED"
    print(f"{name:36} {result}", flush=True)
sys.exit(1 if missed else 0)
