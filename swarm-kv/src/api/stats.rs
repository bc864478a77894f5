//! What a client did: [`Stats`].

/// The operations a client ran since it connected, and the memory roundtrips they
/// took ([`crate::Kv::stats`], [`crate::AsyncKv::stats`]).
///
/// SWARM-KV's gets and updates take one roundtrip in the common case, so
/// [`Stats::roundtrips_per_operation`] close to 1 means the location cache hits and
/// writers rarely contend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Gets run.
    pub gets: u64,
    /// Puts run.
    pub puts: u64,
    /// Inserts-if-absent run.
    pub inserts: u64,
    /// Updates run.
    pub updates: u64,
    /// Deletes run.
    pub deletes: u64,
    /// Operations (of any kind above) that returned an error.
    pub errors: u64,
    /// Memory roundtrips the operations took (lease renewals and recycling run in
    /// their background and are not counted).
    pub roundtrips: u64,
}

impl Stats {
    /// Operations run, of every kind.
    pub fn operations(&self) -> u64 {
        self.gets + self.puts + self.inserts + self.updates + self.deletes
    }

    /// Mean roundtrips per operation (0 before the first one).
    pub fn roundtrips_per_operation(&self) -> f64 {
        match self.operations() {
            0 => 0.0,
            ops => self.roundtrips as f64 / ops as f64,
        }
    }
}

/// The kinds of operations [`Stats`] counts.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpKind {
    Get,
    Put,
    Insert,
    Update,
    Delete,
}

impl Stats {
    /// Counts one operation of `kind` that took `roundtrips` and failed or not.
    pub(crate) fn record(&mut self, kind: OpKind, roundtrips: u32, failed: bool) {
        let counter = match kind {
            OpKind::Get => &mut self.gets,
            OpKind::Put => &mut self.puts,
            OpKind::Insert => &mut self.inserts,
            OpKind::Update => &mut self.updates,
            OpKind::Delete => &mut self.deletes,
        };
        *counter += 1;
        self.errors += u64::from(failed);
        self.roundtrips += u64::from(roundtrips);
    }
}
