//! Whether a writer id's owner still runs, where that can be known: on one host.
//!
//! A lease (SWARM-KV's [`crate::membership::lease`]) bounds when a client *starts*
//! stores, not when they land. A client paused between its lease check and its stores
//! (SIGSTOP, a long preemption, a page fault on a disk-backed node file) stores them
//! whenever it wakes up, however long after its lease ended. rTX (seed `rtx.txt`)
//! calls such a store a "fly WRITE" and never lets a lease's expiry alone release
//! anything. On shared memory every client is a process of the host that maps the
//! node files, and the stores of a process that is gone can never land (its CPU stores
//! happen synchronously, in the process). So on shared memory a writer id is taken
//! over only once its owner's *process is gone*: its lease lapsed and was killed, as
//! everywhere, **and** no process with its pid and start time runs
//! ([`crate::membership::writer_takeover`]). Everything a takeover releases (the row,
//! its log, its pool and limbo of registers, `crate::registers::limbo`, its chunks,
//! `crate::registers::orphans`) then belongs to no process that could still store into
//! it. A stopped client keeps its writer id until it is killed or continued: timing
//! (the lease) then bounds only how soon the others notice, never what a late store
//! can do.
//!
//! The identity is word 2 of the client-table row ([`crate::membership::writer_ids`]):
//! the pid in the low 32 bits, the process's start time (clock ticks since boot,
//! `/proc/PID/stat` field 22) in the high 32, so that a reused pid is not taken for
//! the owner. All clients of one cluster must then share a pid namespace (containers
//! that map the same node files share the host's or one another's). Where `/proc`
//! is not there (not Linux), or over RDMA (clients on other hosts), nothing is known
//! and the lease alone decides, as before.

/// Whether a cluster's clients are processes of this host, so that a takeover can
/// wait for the earlier owner's process to be gone (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OwnerLiveness {
    /// Clients may run on other hosts (RDMA): the lease alone decides.
    #[default]
    Unknown,
    /// Every client is a process of this host (shared memory): a writer id is
    /// taken over only once its owner's process is gone.
    ThisHost,
}

/// The identity of the calling process: pid, and start time when known (see the
/// module docs).
pub fn this_process() -> u64 {
    let pid = std::process::id();
    identity_of(pid).unwrap_or_else(|| identity(pid, 0))
}

/// The identity of the running process `pid`, if there is one (and `/proc`).
pub fn identity_of(pid: u32) -> Option<u64> {
    start_time(pid).map(|start| identity(pid, start))
}

/// The identity of process `pid` that started at `start` (clock ticks since boot).
pub fn identity(pid: u32, start: u64) -> u64 {
    u64::from(pid) | ((start & 0xFFFF_FFFF) << 32)
}

/// Whether the process of `identity` (from [`this_process`] in its owner) still runs:
/// `Some(false)` when no process has its pid, or the one that has it started at
/// another time; `None` when this host cannot tell (no `/proc`, or no identity
/// recorded: a row written before its owner wrote word 2, or by an older build,
/// which recorded the pid alone: then the pid alone decides).
pub fn alive(identity: u64) -> Option<bool> {
    let pid = (identity & 0xFFFF_FFFF) as u32;
    let start = identity >> 32;
    if pid == 0 || !std::path::Path::new("/proc/self/stat").exists() {
        return None;
    }
    match start_time(pid) {
        None => Some(false),
        Some(_) if start == 0 => Some(true),
        Some(now) => Some(now & 0xFFFF_FFFF == start),
    }
}

/// The start time of process `pid` (clock ticks since boot), from `/proc/PID/stat`;
/// `None` if there is no such process (or no `/proc`), or if it has exited and
/// waits to be reaped (a zombie runs no code). The command name (field 2) may hold
/// spaces and parentheses: fields are counted after its last `)`.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    // Field 3 (state) is the first after the name; field 22 (starttime) the 20th.
    if matches!(fields.next()?, "Z" | "X" | "x") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        let me = this_process();
        if alive(me).is_none() {
            eprintln!("no /proc on this host: process liveness is unknown here");
            return;
        }
        assert_eq!(alive(me), Some(true));
        assert_ne!(me >> 32, 0, "a start time is recorded");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let theirs = identity_of(pid).expect("the child runs");
        assert_eq!(alive(theirs), Some(true));
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert_eq!(alive(theirs), Some(false), "a reaped child is gone");
        // The same pid with another start time is another process: gone.
        let reused = identity(std::process::id(), (me >> 32) + 1);
        assert_eq!(alive(reused), Some(false));
        // A pid alone (an older build's row) counts while any process has it.
        assert_eq!(alive(u64::from(std::process::id())), Some(true));
        assert_eq!(alive(0), None);
    }
}
