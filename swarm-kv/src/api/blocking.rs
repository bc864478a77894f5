//! The blocking client: [`Kv`].

use std::cell::Cell;
use std::fmt;

use swarm_core::{OpStats, block_on};

use super::stats::{OpKind, Stats};
use crate::clock::SystemClock;
use crate::{DeleteOutcome, KvClient, KvConfig, KvError, ShmStore, Store};

/// The low-level client a [`Kv`] on store `S` wraps.
type Client<S> = KvClient<<S as Store>::Fabric, SystemClock>;

/// A blocking SWARM-KV client: each method runs one operation on the calling thread
/// and returns its outcome.
///
/// Get one per thread from a shared store handle ([`ShmStore::connect`], or
/// [`Kv::connect`] on any [`Store`]); the store is cheap to clone and `Send + Sync`,
/// the client is neither `Sync` nor `Clone` (it owns a fabric handle and a writer id:
/// see the [crate docs](crate#sharing-across-threads)). Dropping it gives its writer
/// id back, as [`Kv::close`] does.
///
/// Every operation is linearizable. A delete unmaps the key from the index before it
/// returns (the client never defers unmaps: [`KvConfig::deferred_unmaps`] is 0), so
/// a client needs no background work of its own; an operation spins on the memory
/// while it waits for its roundtrips (microseconds) and the client does nothing
/// between operations. A client idle for longer than the cluster's lease revives
/// its lease at its next operation ([`KvConfig::lease_revive_ns`]).
///
/// ```
/// # fn main() -> Result<(), swarm_kv::KvError> {
/// # let dir = std::env::temp_dir().join(format!("swarm-kv-kv-doc-{}", std::process::id()));
/// # let store = swarm_kv::ShmStore::create(&dir, 3, 32 << 20, Default::default())?;
/// let kv = store.connect()?;
/// kv.put("colour", "blue")?;
/// assert!(kv.update("colour", "green")?);
/// assert_eq!(kv.get("colour")?.as_deref(), Some(&b"green"[..]));
/// assert!(!kv.update("shape", "round")?, "update never inserts");
/// assert_eq!(kv.delete("colour")?, swarm_kv::DeleteOutcome::Removed);
/// println!("{:.2} roundtrips per operation", kv.stats().roundtrips_per_operation());
/// kv.close();
/// # drop(store);
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(())
/// # }
/// ```
pub struct Kv<S: Store = ShmStore> {
    /// `Some` until [`Kv::close`] or the drop takes it.
    client: Option<Client<S>>,
    stats: Cell<Stats>,
}

impl<S: Store> Kv<S> {
    /// Connects a client to `store` with the store's default settings: takes a
    /// writer id (a few roundtrips). Fails with [`KvError::WritersFull`] when every
    /// writer id of the cluster is taken.
    pub fn connect(store: &S) -> Result<Self, KvError> {
        Self::connect_with(store, store.config())
    }

    /// [`Kv::connect`] with explicit settings (start from [`Store::config`]).
    /// [`KvConfig::deferred_unmaps`] must be 0 ([`KvError::Unsupported`] otherwise):
    /// this client runs nothing between operations, so a delete cannot leave work
    /// behind it.
    pub fn connect_with(store: &S, config: KvConfig) -> Result<Self, KvError> {
        if config.deferred_unmaps != 0 {
            return Err(KvError::Unsupported(
                "deferring index unmaps (KvConfig::deferred_unmaps > 0) in the blocking and async clients; set it to 0, or drive a KvClient yourself",
            ));
        }
        Ok(Self {
            client: Some(store.client_with(config)?),
            stats: Cell::new(Stats::default()),
        })
    }

    /// The key's value, or `None` if it is absent.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, KvError> {
        let client = self.client();
        let stats = OpStats::new();
        let outcome = block_on(client.fabric(), client.get(key.as_ref(), &stats));
        self.record(OpKind::Get, &stats, outcome.is_err());
        outcome
    }

    /// [`Kv::get`] into `value` (its content replaced, its allocation reused):
    /// `Ok(true)` if the key is present, `Ok(false)` (and `value` emptied) if it is
    /// absent. On shared memory, a get of a key this client has in its location cache
    /// allocates nothing.
    pub fn get_into(&self, key: impl AsRef<[u8]>, value: &mut Vec<u8>) -> Result<bool, KvError> {
        let client = self.client();
        let stats = OpStats::new();
        let outcome = block_on(
            client.fabric(),
            client.get_into(key.as_ref(), value, &stats),
        );
        self.record(OpKind::Get, &stats, outcome.is_err());
        outcome
    }

    /// Sets the key's value, inserting the key if it is absent (an upsert).
    pub fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), KvError> {
        let client = self.client();
        let stats = OpStats::new();
        let outcome = block_on(
            client.fabric(),
            client.insert(key.as_ref(), value.as_ref(), &stats),
        );
        self.record(OpKind::Put, &stats, outcome.is_err());
        outcome
    }

    /// Inserts the key only if it is absent: `Ok(true)` if this call inserted it,
    /// `Ok(false)` if the key held a value, which is left as it was.
    ///
    /// An insert that stalls past its deadline stops with [`KvError::Fenced`]: its
    /// outcome is unknown (read the key).
    pub fn insert(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<bool, KvError> {
        let client = self.client();
        let stats = OpStats::new();
        let outcome = block_on(
            client.fabric(),
            client.insert_if_absent(key.as_ref(), value.as_ref(), &stats),
        );
        self.record(OpKind::Insert, &stats, outcome.is_err());
        outcome
    }

    /// Replaces the value of a present key: `Ok(true)` if it did, `Ok(false)` if the
    /// key is absent (nothing is inserted).
    ///
    /// An update that stalls past its deadline stops with [`KvError::Fenced`]: its
    /// outcome is unknown (read the key).
    pub fn update(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<bool, KvError> {
        let client = self.client();
        let stats = OpStats::new();
        let outcome = block_on(
            client.fabric(),
            client.update(key.as_ref(), value.as_ref(), &stats),
        );
        self.record(OpKind::Update, &stats, outcome.is_err());
        outcome
    }

    /// Deletes the key. After `Ok`, the key is absent whatever the outcome:
    /// [`DeleteOutcome::Removed`] if this call removed its value,
    /// [`DeleteOutcome::Absent`] if there was none, [`DeleteOutcome::Raced`] if
    /// another delete of the same value ran at the same time and which of the two
    /// removed it is undecided. The index unmap is done before it returns.
    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<DeleteOutcome, KvError> {
        let client = self.client();
        let stats = OpStats::new();
        let outcome = block_on(client.fabric(), client.delete(key.as_ref(), &stats));
        self.record(OpKind::Delete, &stats, outcome.is_err());
        outcome
    }

    /// What this client did since it connected.
    pub fn stats(&self) -> Stats {
        self.stats.get()
    }

    /// The writer id this client holds (`swarm stat` lists them).
    pub fn writer(&self) -> u16 {
        self.client().writer()
    }

    /// The low-level client, for what this wrapper does not offer: several
    /// operations in flight on one thread ([`swarm_core::LocalExecutor`]), statistics
    /// per operation, the location cache and recycling counters.
    pub fn client(&self) -> &KvClient<S::Fabric, SystemClock> {
        match &self.client {
            Some(client) => client,
            // `client` is taken only by `close` and `drop`, which consume the `Kv`.
            None => unreachable!("a Kv's client is taken only when the Kv goes away"),
        }
    }

    /// Gives the writer id back. Dropping the client does the same; `close` makes the
    /// point where it happens explicit. It waits (at most milliseconds) for writes
    /// still in flight, and reports no error: what it cannot finish, a later client
    /// takes over (the cluster reclaims what a gone client held).
    pub fn close(mut self) {
        if let Some(client) = self.client.take() {
            client.close();
        }
    }

    fn record(&self, kind: OpKind, stats: &OpStats, failed: bool) {
        let mut total = self.stats.get();
        total.record(kind, stats.roundtrips(), failed);
        self.stats.set(total);
    }
}

impl<S: Store> Drop for Kv<S> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            client.close();
        }
    }
}

impl<S: Store> fmt::Debug for Kv<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kv")
            .field("writer", &self.client.as_ref().map(KvClient::writer))
            .field("stats", &self.stats.get())
            .finish()
    }
}

impl ShmStore {
    /// A blocking client for the calling thread ([`Kv::connect`]).
    pub fn connect(&self) -> Result<Kv<ShmStore>, KvError> {
        Kv::connect(self)
    }
}

#[cfg(feature = "rdma")]
impl crate::RdmaStore {
    /// A blocking client for the calling thread ([`Kv::connect`]).
    pub fn connect(&self) -> Result<Kv<crate::RdmaStore>, KvError> {
        Kv::connect(self)
    }
}
