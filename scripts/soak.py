#!/usr/bin/env python3
"""A soak of SWARM-KV on shared memory: real client processes, a nemesis, checked histories.

Run through scripts/soak.sh (docs/operations.md, "Soak"). One cluster is created with
`swarm init` in a tmpfs directory. `--clients` client processes (`swarm bench`, two
threads each) run churn and YCSB A in turn, each for a random lifetime, each in a key
namespace of its own (`--key-offset`), recording its history (`--history`,
`--history-keys`) and deleting its keys when it ends (`--drain`). When one ends, a new
one takes its slot with a new namespace. Meanwhile a nemesis, at random intervals:

  kill     SIGKILLs a client process (its history is lost; a janitor process later
           deletes what its namespace left, and a replacement starts; a namespace
           whose drain failed gets a janitor too, a fill's included)
  stop     SIGSTOPs a client for 1.5 to 4 leases, then SIGCONTs it
  repair   declares a node's memory lost (sets the retired word of its file's header,
           as a crashed memory node) and, a few seconds later, rebuilds it online with
           `swarm repair`
  corrupt  flips a byte of a node file's header (its checksummed fields or its
           incarnation), so that processes opening the cluster leave the node out,
           then repairs it with `swarm repair`
           (either of these two SIGSTOPs every other `swarm repair` partway for 1.5
           to 4 leases, then SIGCONTs it: event `stop-repair`)
  fill     runs a process that inserts until the register area is (almost) full, holds
           it a few seconds, then deletes every key it inserted

`swarm stat --json` is sampled every few seconds. At the end every history of a process
that was not SIGKILLed is checked with `swarm check`, and memory in use must be
bounded. Exit status 0 if every check passed, 1 otherwise, 2 for bad arguments.
Standard library only.
"""

import argparse
import csv
import json
import os
import random
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

# Cluster parameters: short leases and cache lifetime, so that a short soak recycles
# registers (grace (cache_ttl + max_op) x 9/7 + margin, about 1.6 s) and takes writer
# ids over (lease x 9/8 + max_op x 9/7 + margin, about 1.4 s) many times.
LEASE_S = 1.0
INIT_FLAGS = ["--value-max", "128", "--key-max", "32", "--lease", "1s", "--lease-renew",
              "200ms", "--max-op", "200ms", "--cache-ttl", "1s"]
THREADS = 2            # client threads per client process
FILL_THREADS = 4       # client threads of a fill process
# Client processes log the store's info-level events (repairs followed, reclamation
# passes, stale claim copies taken, lease renewals that failed): the trail a failure
# is explained by. They are a few lines per process; RUST_LOG overrides it.
CLIENT_ENV = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn,swarm_kv=info"))
NAMESPACE = 10**9      # key numbers per namespace (a churn run names 16 x its window)
CHURN_SPACE = 16       # key numbers a churn run names per key of its window
JANITOR_ATTEMPTS = 3   # runs of a janitor whose deletes failed (fenced on a loaded host)
REFUSED = "too small for this benchmark"  # swarm bench refusing to start: no room now
RETIRED_AT = 80        # swarm_core::header::RETIRED_AT
HEADER_BYTES = list(range(0, 56)) + list(range(64, 80))  # checksummed fields, incarnation
KINDS = ["kill", "stop", "repair", "corrupt", "fill"]
# Events counted in the summary: the kinds, and the pauses of a repair they run.
EVENTS = KINDS + ["stop-repair"]
FILL_SETTLE_S = 5      # seconds after a fill ends that memory samples still count it

# An error message of a failed operation that a nemesis explains (see `classify`).
STOP_ERRORS = ("lease", "fenced", "max_op", "stalled", "writer")
# An operation that overran --max-op (`Fenced`), or an insert that stalled past the
# index's acknowledgement wait mid-update and cannot tell whether it mapped its register
# (`OutcomeUnknown`, docs/pauses.md H10): an overloaded host; outcome unknown, and
# recorded so in the history. Counted, not a failure of the soak.
FENCED_ERRORS = ("max_op", "at its deadline", "outcome of this index update is unknown")
FULL_ERRORS = ("register area is full",)
# A delete that raced another through a stale cache with a node out cannot tell whether
# it removed the value (`DeleteUndecided`, ARCHITECTURE.md, "Limitations").
OUTAGE_ERRORS = ("memory node unreachable", "memory node is unreachable")


def parse_duration(text):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return float(text[: -len(unit)]) * units[unit]
    if text.replace(".", "", 1).isdigit():
        return float(text)
    raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 10m)")


class Proc:
    """One `swarm bench` process."""

    def __init__(self, number, kind, slot, ns, workload, keys):
        self.number, self.kind, self.slot, self.ns = number, kind, slot, ns
        self.workload, self.keys = workload, keys
        self.popen = None
        self.start = self.end = None
        self.lifetime = None
        self.killed = self.stopped = False
        self.rc = None
        self.history = self.report = self.log = None
        self.errors = 0
        self.drain_errors = 0
        self.start_failed = False
        self.refused = False       # refused at start while a fill held the cluster
        self.job = None            # a janitor's (namespace, key numbers, attempt)
        self.fenced = 0
        self.error_messages = []
        self.unexpected = []
        self.verdict = "-"
        self.history_ops = 0
        self.log_slots = None

    def name(self):
        return f"#{self.number} {self.kind}" + (f" slot {self.slot}" if self.slot is not None else "")


class Soak:
    def __init__(self, args):
        self.args = args
        self.swarm = args.swarm
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.ending = threading.Event()
        self.failures = []
        self.procs = []
        self.spawned = 0
        self.events = []
        self.samples = []
        self.stat_failures = 0
        self.next_ns = 1
        self.janitor_queue = []
        self.rebuilt_at = {}       # node -> time its last rebuild was admitted
        self.fill_windows = []     # [start, end] of fill processes
        self.outages = []          # [start, end] of node outages (lost or corrupted)
        self.nemesis_rng = random.Random(args.seed)
        self.client_rng = random.Random(args.seed + 1)
        self.work = args.dir
        self.cluster = args.cluster or os.path.join(self.work, "cluster")
        self.hist_dir = os.path.join(self.work, "processes")
        os.makedirs(self.hist_dir, exist_ok=True)

    # -- helpers ---------------------------------------------------------------------

    def now(self):
        return time.monotonic() - self.t0

    def log(self, message):
        print(f"[{self.now():7.1f}s] {message}", flush=True)

    def fail(self, message):
        with self.lock:
            self.failures.append(message)
        self.log(f"FAILURE: {message}")

    def event(self, kind, detail):
        with self.lock:
            self.events.append((round(self.now(), 2), kind, detail))
        self.log(f"nemesis {kind}: {detail}")

    def run(self, argv, timeout):
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    # -- the cluster -------------------------------------------------------------------

    def init_cluster(self):
        self.writers = self.args.clients * THREADS + FILL_THREADS + 1 + 1
        argv = [self.swarm, "init", "--dir", self.cluster, "--size", self.args.size,
                "--writers", str(self.writers)] + INIT_FLAGS
        out = self.run(argv, 120)
        if out.returncode != 0:
            sys.exit(f"soak: swarm init failed:\n{out.stderr}")
        self.log(out.stdout.strip())
        self.log_slots = 0
        for word in out.stdout.split(","):
            if "log slots each" in word:
                self.log_slots = int(word.split("with")[1].split()[0])

    def stat(self):
        try:
            out = self.run([self.swarm, "stat", "--dir", self.cluster, "--json"], 30)
        except subprocess.TimeoutExpired:
            out = None
        if out is None or out.returncode != 0:
            self.stat_failures += 1
            self.log(f"swarm stat failed: {out.stderr.strip() if out else 'timed out'}")
            return None
        return json.loads(out.stdout)

    def sample(self):
        s = self.stat()
        if s is None:
            return None
        regs = s["registers"]
        up = [n for n in s["node_states"] if n["state"] == "up"]
        clients = s["writers"]["clients"]
        with self.lock:
            running = sum(1 for p in self.procs if p.rc is None and p.popen is not None)
        row = {
            "t_s": round(self.now(), 2),
            "keys": s["keys"],
            "in_use": regs["keyed"] + regs["retired_live"],
            "holding_data": regs["holding_data"],
            "keyed": regs["keyed"],
            "leaked_or_inflight": max(regs["keyed"] - s["keys"], 0),
            "retired_live": regs["retired_live"],
            "retired_gone": regs["retired_gone"],
            "pooled_live": regs["pooled_live"],
            "pooled_gone": regs["pooled_gone"],
            "fresh": regs["fresh"],
            "unknown": regs["unknown"],
            "chunks_claimed": max((n["chunks_claimed"] for n in up), default=0),
            "registers_claimed": max((n["registers_claimed"] for n in up), default=0),
            "capacity": s["capacity"],
            "nodes_up": len(up),
            "writers_registered": s["writers"]["registered"],
            "writers_valid": sum(1 for c in clients if c["lease"] == "valid"),
            "writers_ever_used": s["writers"]["ever_used"],
            "processes": running,
        }
        with self.lock:
            self.samples.append(row)
        return row

    # -- client processes --------------------------------------------------------------

    def new_ns(self):
        with self.lock:
            ns = self.next_ns
            self.next_ns += 1
        return ns

    def spawn(self, kind, slot=None, ns=None, workload=None, keys=None, lifetime=None,
              history=True, extra=()):
        ns = self.new_ns() if ns is None else ns
        # Numbered now, listed once started: the supervisor and the nemesis threads
        # only ever see processes that run.
        with self.lock:
            number = self.spawned
            self.spawned += 1
        p = Proc(number, kind, slot, ns, workload, keys)
        base = os.path.join(self.hist_dir, f"p{number:04d}-{kind}")
        p.report, p.log = base + ".json", base + ".log"
        threads = FILL_THREADS if kind == "fill" else (1 if kind == "janitor" else THREADS)
        argv = [self.swarm, "bench", "--dir", self.cluster, "--workload", workload,
                "--keys", str(keys), "--clients", str(threads),
                "--key-offset", str(ns * NAMESPACE), "--drain", "--json", p.report,
                "--seed", str(self.client_rng.randrange(1 << 32))]
        if lifetime is not None:
            argv += ["--duration", f"{int(lifetime * 1000)}ms"]
            p.lifetime = lifetime
        if history:
            p.history = base + ".history.jsonl"
            argv += ["--history", p.history, "--history-keys",
                     str(min(self.args.history_keys, keys * (16 if workload == "churn" else 1)))]
        argv += list(extra)
        with open(p.log, "w") as log:
            log.write(" ".join(argv) + "\n")
            log.flush()
            p.popen = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                       env=CLIENT_ENV)
        p.start = self.now()
        with self.lock:
            self.procs.append(p)
        life = f", {lifetime:.0f} s" if lifetime else ""
        self.log(f"started {p.name()} pid {p.popen.pid}: {workload}, {keys} keys, namespace {ns}{life}")
        return p

    def spawn_client(self, slot, generation):
        remaining = self.args.duration - self.now()
        if remaining < 5:
            return None
        lifetime = min(self.client_rng.uniform(self.args.life_min, self.args.life_max), remaining)
        workload = "churn" if (slot + generation) % 2 == 0 else "a"
        keys = self.args.churn_window if workload == "churn" else self.args.a_keys
        return self.spawn("client", slot=slot, workload=workload, keys=keys, lifetime=lifetime)

    def reap(self, p):
        """Records the end of process `p` (its exit status, report, errors)."""
        p.end = self.now()
        try:
            with open(p.report) as f:
                report = json.load(f)
            if isinstance(report, list):
                report = report[0]
        except (OSError, ValueError):
            report = None
        if report is not None:
            p.errors = report.get("errors", 0)
            p.drain_errors = (report.get("drain") or {}).get("errors", 0)
            p.error_messages = [(s["message"], s["count"]) for s in report.get("error_samples", [])]
            p.log_slots = (report.get("memory_end") or {}).get("log_slots_in_use")
        how = "SIGKILLed" if p.killed else f"exit {p.rc}"
        self.log(f"ended {p.name()} pid {p.popen.pid}: {how}, {p.errors} failed operations")
        if p.killed:
            return
        if p.kind == "fill" and report is None and REFUSED in open(p.log).read():
            self.log(f"{p.name()}: swarm bench refused the fill (fewer free registers than "
                     f"`swarm stat` suggested); not counted")
            p.history = None
            return
        # `swarm bench` refuses to start when the registers free or reclaimable now are
        # fewer than its load needs. While a fill holds the cluster (and until the
        # registers its drain retired pass their grace) that is true by design: the
        # process is started again later. At any other time it is a leak: a failure.
        if report is None and p.rc == 1 and REFUSED in open(p.log).read() \
                and self.during_fill(p.start):
            self.log(f"{p.name()}: refused at start while a fill holds the cluster; "
                     f"started again later")
            p.refused = p.start_failed = True
            p.history = None
            return
        if p.rc not in (0, 1) or report is None:
            p.start_failed = report is None
            tail = open(p.log).read().strip().splitlines()[-5:]
            self.fail(f"{p.name()} exited {p.rc} without a report: {' | '.join(tail)} ({p.log})")
            return
        self.classify(p)

    def during_fill(self, at):
        """Whether time `at` falls in a fill's window or FILL_SETTLE_S after it."""
        with self.lock:
            spans = [(s, self.now() if e is None else e) for s, e in self.fill_windows]
        return any(s <= at <= e + FILL_SETTLE_S for s, e in spans)

    def queue_janitor(self, ns, key_numbers, attempt):
        """Queues a janitor for the key numbers `0..key_numbers` of namespace `ns`
        (a retry 5 s later: a fill may hold the cluster)."""
        due = self.now() + (5 if attempt > 1 else 0)
        with self.lock:
            self.janitor_queue.append((ns, key_numbers, attempt, due))

    def classify(self, p):
        """Failed operations that no nemesis explains are failures of the soak."""
        def overlaps(windows):
            with self.lock:
                spans = [(s, self.now() if e is None else e) for s, e in windows]
            return any(s <= p.end and e + 3 >= p.start for s, e in spans)
        during_fill, during_outage = overlaps(self.fill_windows), overlaps(self.outages)
        for message, count in p.error_messages:
            low = message.lower()
            if p.stopped and any(k in low for k in STOP_ERRORS):
                continue
            if any(k in low for k in FENCED_ERRORS):
                p.fenced += count
                continue
            if (during_fill or p.kind == "fill") and any(k in low for k in FULL_ERRORS):
                continue
            if during_outage and any(k in low for k in OUTAGE_ERRORS):
                continue
            p.unexpected.append((message, count))
        if p.unexpected:
            self.fail(f"{p.name()}: operations failed with no nemesis to explain them: "
                      f"{p.unexpected} ({p.log})")

    def supervise(self, until):
        """Reaps ended processes, starts replacements and janitors, samples memory."""
        generation = {}
        respawn = []
        next_sample = 0.0
        while True:
            with self.lock:
                live = [p for p in self.procs if p.rc is None]
            for p in live:
                rc = p.popen.poll()
                if rc is None:
                    continue
                p.rc = rc
                self.reap(p)
                names = p.keys * (CHURN_SPACE if p.workload == "churn" else 1)
                if p.kind == "janitor":
                    # A janitor whose deletes failed (fenced on a loaded host: their
                    # outcome is unknown), or refused while a fill ran, runs again.
                    ns, names, attempt = p.job
                    if (p.refused or p.rc != 0 or p.errors) and attempt < JANITOR_ATTEMPTS:
                        self.queue_janitor(ns, names, attempt + 1)
                    continue
                if p.kind == "fill":
                    # A fill whose drain failed may keep keys: a janitor deletes them.
                    if p.drain_errors or (p.killed and not p.refused):
                        self.queue_janitor(p.ns, names, 1)
                    continue
                if (p.killed or p.errors) and not p.refused:
                    # Its namespace may keep keys (a killed process never drained): a
                    # janitor deletes them; none of its keys is in anyone's history.
                    self.queue_janitor(p.ns, names, 1)
                if p.slot is not None and not self.ending.is_set():
                    generation[p.slot] = generation.get(p.slot, 0) + 1
                    # A process that could not start (the cluster refused it) is
                    # replaced 5 s later, not at once.
                    respawn.append((self.now() + (5 if p.start_failed else 0), p.slot))
            for due, slot in [r for r in respawn if r[0] <= self.now()]:
                respawn.remove((due, slot))
                if not self.ending.is_set():
                    self.spawn_client(slot, generation[slot])
            with self.lock:
                janitor_running = any(q.kind == "janitor" and q.rc is None for q in self.procs)
                due = [j for j in self.janitor_queue if j[3] <= self.now()]
                job = due[0] if due and not janitor_running else None
                if job is not None:
                    self.janitor_queue.remove(job)
            if job is not None:
                # Churn loads nothing and its drain deletes 16 names per key of its
                # window: a window of a sixteenth of the namespace's names deletes
                # them all, without loading them again first.
                ns, names, attempt, _ = job
                janitor = self.spawn("janitor", ns=ns, workload="churn",
                                     keys=-(-names // CHURN_SPACE), history=False,
                                     extra=["--ops", "1", "--no-warm-cache"])
                janitor.job = (ns, names, attempt)
            if self.now() >= next_sample:
                self.sample()
                next_sample = self.now() + self.args.sample_every
            with self.lock:
                busy = any(p.rc is None for p in self.procs) or self.janitor_queue
            if until() and not busy:
                return
            # A process that runs 120 s past its lifetime (a janitor: past its start)
            # hangs: a failure; it is killed so that the soak ends.
            with self.lock:
                hung = [p for p in self.procs if p.rc is None and not p.killed
                        and self.now() > p.start + (p.lifetime or 0) + 120]
            for p in hung:
                self.fail(f"{p.name()} pid {p.popen.pid} hangs: still runs 120 s after its "
                          f"end (log {p.log}): killed")
                p.killed = True
                p.popen.kill()
            time.sleep(0.2)

    # -- the nemesis -------------------------------------------------------------------

    def running_clients(self):
        with self.lock:
            return [p for p in self.procs if p.kind == "client" and p.rc is None
                    and not p.killed and p.start is not None and self.now() - p.start > 1]

    def nemesis(self):
        kinds = self.args.nemesis
        if not kinds:
            return
        rng = self.nemesis_rng
        while not self.ending.is_set():
            if self.ending.wait(rng.uniform(self.args.interval_min, self.args.interval_max)):
                return
            kind = rng.choice(kinds)
            try:
                getattr(self, f"nemesis_{kind}")(rng)
            except Exception as error:  # a bug of this script: stop the soak, say so
                self.fail(f"nemesis {kind} raised {error!r}")
                self.ending.set()

    def nemesis_kill(self, rng):
        clients = [p for p in self.running_clients() if not p.stopped]
        if not clients:
            return
        p = rng.choice(clients)
        p.killed = True
        p.popen.send_signal(signal.SIGKILL)
        self.event("kill", f"SIGKILL {p.name()} pid {p.popen.pid} (namespace {p.ns})")

    def nemesis_stop(self, rng):
        clients = self.running_clients()
        if not clients:
            return
        p = rng.choice(clients)
        pause = rng.uniform(1.5, 4.0) * LEASE_S
        p.stopped = True
        p.popen.send_signal(signal.SIGSTOP)
        self.event("stop", f"SIGSTOP {p.name()} pid {p.popen.pid} for {pause:.1f} s")
        time.sleep(pause)
        p.popen.send_signal(signal.SIGCONT)
        self.log(f"SIGCONT {p.name()} pid {p.popen.pid}")

    def eligible_node(self, rng):
        """A node no running process has seen rebuilt: an opened cluster admits a
        rebuilt node slot once (ARCHITECTURE.md, "Limitations")."""
        with self.lock:
            starts = [p.start for p in self.procs if p.rc is None and p.start is not None]
        oldest = min(starts, default=self.now())
        nodes = [n for n in range(3) if self.rebuilt_at.get(n, -1) < oldest]
        return rng.choice(nodes) if nodes else None

    def node_file(self, node):
        return os.path.join(self.cluster, f"node-{node}.swarm")

    def repair(self, node, outage, rng):
        """Rebuilds `node` online with `swarm repair`; every other repair is SIGSTOPped
        for 1.5 to 4 leases partway (0.5 to 6 s after it starts: in its quiescence wait
        or its copy), then SIGCONTed."""
        began = self.now()
        pause_after = rng.uniform(0.5, 6.0) if rng.random() < 0.5 else None
        pause = rng.uniform(1.5, 4.0) * LEASE_S
        argv = [self.swarm, "repair", "--dir", self.cluster, "--node", str(node)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True)
        if pause_after is not None:
            try:
                proc.wait(timeout=pause_after)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGSTOP)
                self.event("stop-repair", f"SIGSTOP swarm repair --node {node} pid {proc.pid} "
                           f"for {pause:.1f} s")
                time.sleep(pause)
                proc.send_signal(signal.SIGCONT)
                self.log(f"SIGCONT swarm repair pid {proc.pid}")
        try:
            text, _ = proc.communicate(timeout=300)
            rc, text = proc.returncode, text.strip()
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            rc, text = "timeout", "swarm repair ran for 300 s"
        self.rebuilt_at[node] = self.now()
        with self.lock:
            outage[1] = self.now()
        last = text.splitlines()[-1] if text else ""
        if rc != 0:
            self.fail(f"swarm repair --node {node} exited {rc}: {text}")
        else:
            self.log(f"repaired node {node} in {self.now() - began:.1f} s: {last}")

    def nemesis_repair(self, rng):
        node = self.eligible_node(rng)
        if node is None:
            self.log("nemesis repair: skipped, every node was rebuilt under a running process")
            return
        outage = self.outage()
        with open(self.node_file(node), "r+b") as f:
            f.seek(RETIRED_AT)
            f.write(struct.pack("<Q", 1))
        wait = rng.uniform(1.0, 4.0)
        self.event("repair", f"node {node} lost (retired word set); repair in {wait:.1f} s")
        time.sleep(wait)
        self.repair(node, outage, rng)

    def outage(self):
        window = [self.now(), None]
        with self.lock:
            self.outages.append(window)
        return window

    def nemesis_corrupt(self, rng):
        node = self.eligible_node(rng)
        if node is None:
            self.log("nemesis corrupt: skipped, every node was rebuilt under a running process")
            return
        at, flip = rng.choice(HEADER_BYTES), rng.randrange(1, 256)
        outage = self.outage()
        with open(self.node_file(node), "r+b") as f:
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ flip]))
        wait = rng.uniform(1.0, 4.0)
        self.event("corrupt", f"node {node} header byte {at} xor {flip:#04x}; repair in {wait:.1f} s")
        time.sleep(wait)
        self.repair(node, outage, rng)

    def nemesis_fill(self, rng):
        s = self.stat()
        if s is None:
            return
        regs = s["registers"]
        claimed = max((n["registers_claimed"] for n in s["node_states"] if n["state"] == "up"),
                      default=0)
        free = s["capacity"] - claimed + regs["retired_gone"] + regs["pooled_gone"]
        # Room left in whole chunks per fill thread, and what its logs can hold.
        keys = min(free - 256 * FILL_THREADS * 2, FILL_THREADS * (self.log_slots - 300))
        if keys < 1000:
            self.log(f"nemesis fill: skipped, only {free} registers free")
            return
        hold = rng.uniform(2.0, 5.0)
        self.event("fill", f"{keys} keys into {free} free registers, held {hold:.1f} s, then deleted")
        window = [self.now(), None]
        with self.lock:
            self.fill_windows.append(window)
        p = self.spawn("fill", workload="c", keys=keys, lifetime=hold,
                       extra=["--no-warm-cache"])
        try:
            p.popen.wait(timeout=300)
        except subprocess.TimeoutExpired:
            pass
        with self.lock:
            window[1] = self.now()

    # -- the end -----------------------------------------------------------------------

    def scrub(self):
        """Once every process ended: `swarm scrub`, as an operator runs it after nodes
        were out (a node that was out or rebuilt holds lagging index copies until a
        scrub moves them forward); the keys left are counted after it. `swarm stat`
        counts keys as lookups read them, every node's copy merged."""
        before = self.stat()
        try:
            out = self.run([self.swarm, "scrub", "--dir", self.cluster], 300)
            rc, text = out.returncode, (out.stdout + out.stderr).strip()
        except subprocess.TimeoutExpired:
            rc, text = "timeout", "swarm scrub ran for 300 s"
        last = text.splitlines()[-1] if text else ""
        if rc != 0:
            self.fail(f"swarm scrub exited {rc}: {text}")
        else:
            keys = before["keys"] if before else "?"
            self.log(f"scrubbed the index ({keys} keys counted before): {last}")

    def check_histories(self):
        for p in self.procs:
            if p.killed or p.history is None or p.rc not in (0, 1):
                continue
            if not os.path.exists(p.history):
                self.fail(f"{p.name()}: no history written ({p.log})")
                p.verdict = "missing"
                continue
            with open(p.history) as f:
                p.history_ops = sum(1 for _ in f)
            out = self.run([self.swarm, "check", p.history], 1800)
            first = (out.stdout.strip().splitlines() or [""])[0]
            p.verdict = "pass" if out.returncode == 0 else "FAIL"
            if out.returncode != 0:
                self.fail(f"{p.name()}: history not linearizable: {first} ({p.history}; "
                          f"{out.stdout.strip()[:2000]})")
            elif not self.args.keep:
                os.remove(p.history)

    def memory_bounds(self):
        """Registers in use (with a key header, or retired in the limbo of a client
        that holds a writer id): the peak over the last third of the samples must stay
        within 2x the peak over the first third, plus one chunk (256) so that small
        counts do not trip it; samples taken while a fill runs (and FILL_SETTLE_S
        after) are left out before the samples are split in thirds, since a fill holds
        most of the cluster by design. Reported only: register chunks claimed (clients claim
        unclaimed chunks before they reclaim gone clients' registers, so claims grow up
        to the capacity by design), registers with a key header but no key while
        clients run (`swarm stat` counts keys and registers one after the other, so
        inserts and deletes in between show up), writer ids registered. At the end,
        with every process gone and every namespace drained (a namespace whose drain
        failed or whose process was SIGKILLed drained again by a janitor, up to
        JANITOR_ATTEMPTS times), no key may be left; not judged only when a janitor's
        last attempt failed too."""
        # Samples while a fill runs (and for a few seconds after, while the registers
        # its drain retired pass their grace) count the fill's keys: in use by design.
        with self.lock:
            fills = [(s, self.now() if e is None else e) for s, e in self.fill_windows]
        rows = [r for r in self.samples if r["t_s"] <= self.args.duration
                and not any(s <= r["t_s"] <= e + FILL_SETTLE_S for s, e in fills)]
        # The first and the last third of those samples, in time order: with fills
        # covering much of a short soak, thirds of its time often held no sample
        # outside a fill, and the bound went unjudged.
        third = len(rows) // 3
        first, last = (rows[:third], rows[-third:]) if third >= 2 else ([], [])
        results = []
        for metric in ("in_use", "chunks_claimed", "leaked_or_inflight", "writers_registered"):
            if not first or not last:
                results.append((metric, None, None, None, "too few samples outside fills"))
                continue
            if metric != "in_use":
                results.append((metric, max(r[metric] for r in first),
                                max(r[metric] for r in last), None, "(reported)"))
                continue
            slack = 256
            peak_first = max(r[metric] for r in first)
            peak_last = max(r[metric] for r in last)
            bound = 2 * peak_first + slack
            ok = peak_last <= bound
            results.append((metric, peak_first, peak_last, bound, "ok" if ok else "GROWING"))
            if not ok:
                self.fail(f"memory keeps growing: {metric} peaked at {peak_last} in the last "
                          f"third, above 2 x {peak_first} + {slack} (first third's peak)")
        # A janitor that failed its last attempt (deletes fenced on a loaded host:
        # their outcome is unknown) may leave keys. Drains that failed, fills' too,
        # got janitors.
        cleanups_failed = any(p.kind == "janitor" and (p.rc != 0 or p.errors or p.refused)
                              and p.job[2] >= JANITOR_ATTEMPTS for p in self.procs)
        if cleanups_failed:
            results.append(("keys at the end", None, self.samples[-1]["keys"] if self.samples
                            else None, None, "not judged: a janitor failed its last attempt"))
        if self.samples and not cleanups_failed:
            left = self.samples[-1]["keys"]
            verdict = "ok" if left == 0 else "KEYS LEFT"
            results.append(("keys at the end", None, left, 0, verdict))
            if left:
                self.fail(f"{left} keys left in the cluster after every process drained its "
                          f"namespace and every janitor succeeded")
        return results

    def write_csv(self):
        path = os.path.join(self.work, "soak.csv")
        if self.samples:
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(self.samples[0]))
                w.writeheader()
                w.writerows(self.samples)
        with open(os.path.join(self.work, "soak-processes.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["process", "kind", "slot", "workload", "keys", "namespace", "pid",
                        "start_s", "end_s", "killed", "stopped", "exit", "failed_ops",
                        "unexpected_errors", "log_slots_at_end", "history_ops", "verdict"])
            for p in self.procs:
                w.writerow([p.number, p.kind, p.slot, p.workload, p.keys, p.ns,
                            p.popen.pid if p.popen else "", round(p.start or 0, 2),
                            round(p.end or 0, 2), p.killed, p.stopped, p.rc, p.errors,
                            sum(c for _, c in p.unexpected), p.log_slots, p.history_ops,
                            p.verdict])
        with open(os.path.join(self.work, "soak-events.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["t_s", "nemesis", "detail"])
            w.writerows(self.events)
        return path

    def plot(self, csv_path):
        out = self.args.plot
        os.makedirs(out, exist_ok=True)
        series = ["keys", "in_use", "holding_data", "chunks_claimed", "leaked_or_inflight",
                  "writers_registered"]
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            plt = None
        if plt is not None:
            fig, ax = plt.subplots(4, 1, figsize=(10, 10), sharex=True,
                                   gridspec_kw={"height_ratios": [3, 1.3, 1.3, 1.3]})
            t = [r["t_s"] for r in self.samples]
            col = lambda name: [r[name] for r in self.samples]  # noqa: E731
            for name, label in (("keys", "keys"),
                                ("in_use", "registers in use (keyed + retired, live clients)"),
                                ("holding_data", "registers holding data"),
                                ("leaked_or_inflight", "keyed without a key (in flight or leaked)")):
                ax[0].plot(t, col(name), label=label)
            ax[0].set_ylabel("registers")
            ax[1].plot(t, col("chunks_claimed"), label="register chunks claimed", color="C4")
            ax[1].set_ylabel("chunks")
            # Log slots are reported by each process at its exit (its report).
            ends = [p for p in self.procs if p.log_slots is not None and p.end is not None]
            for kind, colour in (("client", "C0"), ("janitor", "C2"), ("fill", "C3")):
                pts = [(p.end, p.log_slots) for p in ends if p.kind == kind]
                if pts:
                    ax[2].scatter([x for x, _ in pts], [y for _, y in pts], s=12, color=colour,
                                  label=f"log slots a {kind} held at its exit")
            ax[2].set_ylabel("log slots")
            ax[3].plot(t, col("writers_registered"), label="writer ids registered")
            ax[3].plot(t, col("writers_valid"), label="writer ids with a valid lease")
            ax[3].plot(t, col("processes"), label="processes running")
            ax[3].set_ylabel("count")
            ax[3].set_xlabel("seconds")
            colours = {"kill": "red", "stop": "orange", "repair": "purple", "corrupt": "brown",
                       "fill": "green", "stop-repair": "magenta"}
            with self.lock:
                fills = [(s, e) for s, e in self.fill_windows if e is not None]
            for a in ax:
                for at, kind, _ in self.events:
                    a.axvline(at, color=colours.get(kind, "grey"), alpha=0.5, lw=0.8)
                for s, e in fills:
                    a.axvspan(s, e, color="green", alpha=0.08)
            from matplotlib.lines import Line2D
            seen = [k for k in colours if any(kind == k for _, kind, _ in self.events)]
            proxies = [Line2D([0], [0], color=colours[k], lw=1) for k in seen]
            legend = ax[0].legend(loc="upper left", fontsize="small")
            ax[0].add_artist(legend)
            if proxies:
                ax[0].legend(proxies, [f"nemesis {k}" for k in seen], loc="upper right",
                             fontsize="small")
            for a in ax[1:]:
                a.legend(loc="upper left", fontsize="small")
            ax[0].set_title(f"swarm soak, seed {self.args.seed}, {self.args.duration:.0f} s: "
                            f"memory in use (shaded: fills)")
            fig.tight_layout()
            fig.savefig(os.path.join(out, "soak-memory.png"), dpi=80)
            plt.close(fig)
            self.log(f"figure: {os.path.join(out, 'soak-memory.png')}")
        elif shutil.which("gnuplot"):
            png = os.path.join(out, "soak-memory.png")
            cols = list(self.samples[0]) if self.samples else []
            plots = ", ".join(f"'{csv_path}' using 1:{cols.index(s) + 1} with lines title '{s}'"
                              for s in series if s in cols)
            script = (f"set datafile separator ','; set key autotitle columnhead; "
                      f"set terminal png size 1000,600; set output '{png}'; "
                      f"set xlabel 'seconds'; set ylabel 'registers'; plot {plots}")
            subprocess.run(["gnuplot", "-e", script], check=False)
            self.log(f"figure: {png}")
        else:
            self.log("--plot: neither matplotlib nor gnuplot is installed; no figure "
                     f"(the data is in {csv_path})")

    def summary(self, bounds, csv_path):
        a = self.args
        procs = self.procs
        clients = [p for p in procs if p.kind == "client"]
        count = lambda kind: sum(1 for _, k, _ in self.events if k == kind)  # noqa: E731
        print()
        print(f"== soak summary: seed {a.seed}, {a.duration:.0f} s, {a.clients} client slots, "
              f"nemesis {','.join(a.nemesis) or 'none'}")
        print(f"{'processes':<28} {len(clients)} clients ({sum(p.workload == 'churn' for p in clients)} churn, "
              f"{sum(p.workload == 'a' for p in clients)} YCSB A), "
              f"{sum(p.kind == 'fill' for p in procs)} fills, {sum(p.kind == 'janitor' for p in procs)} janitors")
        print(f"{'nemesis events':<28} " + ", ".join(f"{k} {count(k)}" for k in EVENTS))
        checked = [p for p in procs if p.verdict in ("pass", "FAIL", "missing")]
        passed = sum(p.verdict == "pass" for p in checked)
        print(f"{'histories checked':<28} {passed} of {len(checked)} linearizable "
              f"({sum(p.history_ops for p in checked)} operations); "
              f"{sum(p.killed for p in procs)} lost to SIGKILL")
        stopped = [p for p in procs if p.stopped]
        print(f"{'failed operations':<28} {sum(p.errors for p in procs)} in all; "
              f"{sum(p.errors for p in stopped)} in {len(stopped)} stopped processes; "
              f"{sum(p.fenced for p in procs)} fenced elsewhere (overloaded host); "
              f"{sum(c for p in procs for _, c in p.unexpected)} unexplained")
        if self.samples:
            last = self.samples[-1]
            print(f"{'at the end':<28} {last['keys']} keys, {last['in_use']} registers in use, "
                  f"{last['holding_data']} holding data, {last['chunks_claimed']} chunks claimed, "
                  f"{last['writers_registered']} writer ids registered of {self.writers}")
        slots = [p.log_slots for p in procs if p.log_slots is not None]
        if slots:
            print(f"{'log slots held at exit':<28} at most {max(slots)} per process")
        print(f"{'stat samples':<28} {len(self.samples)} ({self.stat_failures} failed)")
        print()
        print(f"{'memory':<20} {'peak 1st third':>15} {'peak last third':>16} {'bound':>8}  verdict")
        for metric, first, last, bound, verdict in bounds:
            print(f"{metric:<20} {first if first is not None else '-':>15} "
                  f"{last if last is not None else '-':>16} {bound if bound is not None else '-':>8}  {verdict}")
        print()
        print(f"samples: {csv_path}; processes and events: soak-processes.csv, soak-events.csv "
              f"in {self.work}")
        if self.failures:
            print(f"== soak FAILED ({len(self.failures)}); replay the seed with: {self.replay()}")
            for f in self.failures:
                print(f"  - {f}")
        else:
            print("== soak passed")

    def replay(self):
        """The command line of this soak, with its seed and without its --dir."""
        argv, skip = [], False
        for arg in sys.argv[1:]:
            if skip:
                skip = False
            elif arg in ("--seed", "--dir"):
                skip = True
            elif not arg.startswith(("--seed=", "--dir=")):
                argv.append(shlex.quote(arg))
        return " ".join(["scripts/soak.sh"] + argv + ["--seed", str(self.args.seed)])

    def main(self):
        a = self.args
        self.log(f"soak seed {a.seed} in {self.work}, {a.duration:.0f} s, nemesis "
                 f"{','.join(a.nemesis) or 'none'}; replay: {self.replay()}")
        self.init_cluster()
        for slot in range(a.clients):
            self.spawn_client(slot, 0)
        nemesis = threading.Thread(target=self.nemesis, daemon=True)
        nemesis.start()
        ended = lambda: self.now() >= a.duration  # noqa: E731

        def stop_at_end():
            while not ended():
                time.sleep(0.2)
            self.ending.set()
            self.log("soak time is up: no new process; waiting for the running ones")
        threading.Thread(target=stop_at_end, daemon=True).start()
        self.supervise(lambda: self.ending.is_set() and not nemesis.is_alive())
        nemesis.join()
        self.scrub()
        # Memory after every process ended: a few more samples.
        for _ in range(3):
            time.sleep(a.sample_every)
            self.sample()
        self.check_histories()
        bounds = self.memory_bounds()
        csv_path = self.write_csv()
        if a.plot:
            self.plot(csv_path)
        self.summary(bounds, csv_path)
        return 1 if self.failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="working directory, on tmpfs since the cluster lives in it (default: the "
                        "cluster in a new directory under /dev/shm, logs and histories in one under "
                        "target/soak; both removed if the soak passes)")
    parser.add_argument("--duration", type=parse_duration, default=600.0, help="e.g. 2m, 10m (default 10m)")
    parser.add_argument("--clients", type=int, default=4, help="client processes at once (default 4)")
    parser.add_argument("--nemesis", default="all", help="all, none, or a list of " + ",".join(KINDS))
    parser.add_argument("--history-keys", type=int, default=300, help="keys recorded per process (default 300)")
    parser.add_argument("--plot", help="draw the memory figure into this directory")
    parser.add_argument("--seed", type=int, default=None, help="seed of the nemesis and the clients (default: random, printed)")
    parser.add_argument("--swarm", help="the swarm binary (default: $CARGO_TARGET_DIR or target, release)")
    parser.add_argument("--size", default="256MiB", help="bytes per memory node (default 256MiB)")
    parser.add_argument("--a-keys", type=int, default=3000, help="keys of a YCSB A process (default 3000)")
    parser.add_argument("--churn-window", type=int, default=300, help="live keys of a churn process (default 300)")
    parser.add_argument("--life-min", type=float, default=20.0, help="shortest client lifetime, s (default 20)")
    parser.add_argument("--life-max", type=float, default=60.0, help="longest client lifetime, s (default 60)")
    parser.add_argument("--interval-min", type=float, default=3.0, help="shortest pause between nemesis events, s")
    parser.add_argument("--interval-max", type=float, default=10.0, help="longest pause between nemesis events, s")
    parser.add_argument("--sample-every", type=float, default=2.0, help="swarm stat period, s (default 2)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory and passed histories")
    args = parser.parse_args()
    if args.nemesis == "all":
        args.nemesis = list(KINDS)
    elif args.nemesis == "none":
        args.nemesis = []
    else:
        args.nemesis = args.nemesis.split(",")
        bad = [k for k in args.nemesis if k not in KINDS]
        if bad:
            parser.error(f"unknown nemesis {bad}: choose among {','.join(KINDS)}, all or none")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 32)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(root, "target")
    if args.swarm is None:
        args.swarm = os.path.join(target, "release", "swarm")
    if not os.access(args.swarm, os.X_OK):
        parser.error(f"no swarm binary at {args.swarm}: cargo build --release -p swarm-cli, or --swarm PATH")
    # By default only the node files live in RAM (/dev/shm); logs and histories (a
    # 30-minute soak writes gigabytes of them) go to disk, and a failed soak's cluster
    # is moved next to them, so that no run leaves memory behind.
    temporary = args.dir is None
    args.cluster = None
    if temporary:
        disk = os.path.join(target, "soak")
        os.makedirs(disk, exist_ok=True)
        args.dir = tempfile.mkdtemp(prefix="swarm-soak-", dir=disk)
        args.cluster = tempfile.mkdtemp(prefix="swarm-soak-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.makedirs(args.dir, exist_ok=True)
    try:
        status = Soak(args).main()
    except BaseException:
        status = 1
        raise
    finally:
        if temporary and status == 0 and not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
            shutil.rmtree(args.cluster, ignore_errors=True)
        elif temporary:
            kept = os.path.join(args.dir, "cluster")
            shutil.move(args.cluster, kept)
            print(f"soak: the cluster, logs and histories are kept in {args.dir}")
        elif status != 0:
            print(f"soak: the cluster, logs and histories are kept in {args.dir}")
    return status


if __name__ == "__main__":
    sys.exit(main())
