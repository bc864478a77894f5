//! The async client: [`AsyncKv`], served by a worker thread.
//!
//! SWARM-KV's operations are futures that only complete while something calls the
//! fabric's `progress` between polls ([`swarm_core::exec`]): a tokio task polling
//! them would spin on its executor thread. So an [`AsyncKv`] owns a dedicated worker
//! thread holding a blocking [`Kv`]; each method sends the operation to the worker
//! over a channel and returns a future that waits, without spinning, for the
//! worker's answer (a hand-written one-value channel that wakes the task). It
//! works on any executor and the crate depends on none.

use std::fmt;
use std::future::Future;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};

use super::blocking::Kv;
use super::oneshot;
use super::stats::Stats;
use crate::{DeleteOutcome, KvConfig, KvError, ShmStore, Store};

/// An operation sent to the worker, with where its outcome goes.
enum Request {
    Get {
        key: Vec<u8>,
        reply: oneshot::Sender<Result<Option<Vec<u8>>, KvError>>,
    },
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        reply: oneshot::Sender<Result<(), KvError>>,
    },
    Insert {
        key: Vec<u8>,
        value: Vec<u8>,
        reply: oneshot::Sender<Result<bool, KvError>>,
    },
    Update {
        key: Vec<u8>,
        value: Vec<u8>,
        reply: oneshot::Sender<Result<bool, KvError>>,
    },
    Delete {
        key: Vec<u8>,
        reply: oneshot::Sender<Result<DeleteOutcome, KvError>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

/// An async SWARM-KV client for applications on tokio or any other executor: its
/// methods return `Send` futures, and it is `Send + Sync`, so tasks share one through
/// an [`Arc`] (or each connects its own).
///
/// **Cost model.** Each `AsyncKv` is one worker thread holding one blocking client
/// ([`Kv`]) and one writer id of the cluster (64 by default, shared by every client
/// of every process). The worker runs the operations sent to it one at a time, in
/// the order they arrive, each spinning on the memory for its roundtrips
/// (microseconds); between operations it sleeps in a channel receive. A call costs
/// a channel send, a thread wake-up and a task wake-up on top of the operation
/// (a few microseconds), so one `AsyncKv` serves a few hundred thousand operations
/// per second at most, whatever the number of tasks using it: for more, connect
/// several (one per core, say) and spread tasks over them.
///
/// **Cancellation.** An operation runs once its future was polled: dropping the
/// future then does not cancel it, only discards its outcome.
///
/// **Closing.** Dropping an `AsyncKv` stops its worker, which gives the writer id
/// back in the background; [`AsyncKv::close`] waits until that is done (do it
/// before the process exits, or the id stays taken until its lease expires).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), swarm_kv::KvError> {
/// # let dir = std::env::temp_dir().join(format!("swarm-kv-async-doc-{}", std::process::id()));
/// # let store = swarm_kv::ShmStore::create(&dir, 3, 32 << 20, Default::default())?;
/// let kv = std::sync::Arc::new(store.connect_async().await?);
/// let task = tokio::spawn({
///     let kv = kv.clone();
///     async move { kv.put("k", "v").await }
/// });
/// task.await.expect("the task")?;
/// assert_eq!(kv.get("k").await?, Some(b"v".to_vec()));
/// if let Ok(kv) = std::sync::Arc::try_unwrap(kv) {
///     kv.close().await;
/// }
/// # drop(store);
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(())
/// # }
/// ```
pub struct AsyncKv {
    requests: mpsc::Sender<Request>,
    stats: Arc<Mutex<Stats>>,
    writer: u16,
}

impl AsyncKv {
    /// Starts a worker thread that connects a client to `store` with the store's
    /// default settings ([`Kv::connect`]); resolves once the client holds its writer
    /// id. The thread is started by this call, the future only waits for it.
    pub fn connect<S>(store: &S) -> impl Future<Output = Result<AsyncKv, KvError>> + Send + use<S>
    where
        S: Store + Clone + Send + 'static,
    {
        Self::connect_with(store, store.config())
    }

    /// [`AsyncKv::connect`] with explicit settings ([`Kv::connect_with`]).
    pub fn connect_with<S>(
        store: &S,
        config: KvConfig,
    ) -> impl Future<Output = Result<AsyncKv, KvError>> + Send + use<S>
    where
        S: Store + Clone + Send + 'static,
    {
        let store = store.clone();
        let (ready, connected) = oneshot::channel();
        let (requests, inbox) = mpsc::channel();
        let stats = Arc::new(Mutex::new(Stats::default()));
        let shared = Arc::clone(&stats);
        let spawned = std::thread::Builder::new()
            .name("swarm-kv-async".into())
            .spawn(move || {
                let kv = match Kv::connect_with(&store, config) {
                    Ok(kv) => kv,
                    Err(error) => return ready.send(Err(error)),
                };
                drop(store);
                ready.send(Ok(kv.writer()));
                let close = serve(&kv, &inbox, &shared);
                kv.close();
                if let Some(reply) = close {
                    reply.send(());
                }
            });
        async move {
            spawned.map_err(KvError::WorkerSpawn)?;
            let writer = connected.await.ok_or(KvError::WorkerStopped)??;
            Ok(AsyncKv {
                requests,
                stats,
                writer,
            })
        }
    }

    /// The key's value, or `None` if it is absent ([`Kv::get`]).
    pub fn get(
        &self,
        key: impl AsRef<[u8]>,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, KvError>> + Send + '_ {
        let key = key.as_ref().to_vec();
        self.call(|reply| Request::Get { key, reply })
    }

    /// Sets the key's value, inserting the key if it is absent ([`Kv::put`]).
    pub fn put(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> impl Future<Output = Result<(), KvError>> + Send + '_ {
        let (key, value) = (key.as_ref().to_vec(), value.as_ref().to_vec());
        self.call(|reply| Request::Put { key, value, reply })
    }

    /// Inserts the key only if it is absent; `false` if it held a value
    /// ([`Kv::insert`]).
    pub fn insert(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> impl Future<Output = Result<bool, KvError>> + Send + '_ {
        let (key, value) = (key.as_ref().to_vec(), value.as_ref().to_vec());
        self.call(|reply| Request::Insert { key, value, reply })
    }

    /// Replaces the value of a present key; `false` if it is absent ([`Kv::update`]).
    pub fn update(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> impl Future<Output = Result<bool, KvError>> + Send + '_ {
        let (key, value) = (key.as_ref().to_vec(), value.as_ref().to_vec());
        self.call(|reply| Request::Update { key, value, reply })
    }

    /// Deletes the key ([`Kv::delete`]: after `Ok` the key is absent, whatever the
    /// outcome).
    pub fn delete(
        &self,
        key: impl AsRef<[u8]>,
    ) -> impl Future<Output = Result<DeleteOutcome, KvError>> + Send + '_ {
        let key = key.as_ref().to_vec();
        self.call(|reply| Request::Delete { key, reply })
    }

    /// What this client did since it connected (operations whose outcome came back).
    pub fn stats(&self) -> Stats {
        *self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The writer id the worker's client holds.
    pub fn writer(&self) -> u16 {
        self.writer
    }

    /// Stops the worker and waits until it gave the writer id back ([`Kv::close`]).
    pub async fn close(self) {
        let (reply, done) = oneshot::channel();
        // A worker already gone (it panicked) gave its id back while unwinding.
        let _ = self.requests.send(Request::Close { reply });
        done.await;
    }

    /// Sends the request `make` builds and waits for its outcome.
    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, KvError>>) -> Request,
    ) -> Result<T, KvError> {
        let (reply, outcome) = oneshot::channel();
        // If the worker is gone, the request comes back in the error and is dropped
        // with its reply sender: `outcome` then resolves to `None`.
        let _ = self.requests.send(make(reply));
        outcome.await.ok_or(KvError::WorkerStopped)?
    }
}

/// The worker's loop: runs the requests in arrival order until a close (returns
/// where to answer it once the client is closed) or until every sender is gone (the
/// `AsyncKv` was dropped: returns `None`).
fn serve<S: Store>(
    kv: &Kv<S>,
    inbox: &mpsc::Receiver<Request>,
    stats: &Mutex<Stats>,
) -> Option<oneshot::Sender<()>> {
    let publish = || *stats.lock().unwrap_or_else(PoisonError::into_inner) = kv.stats();
    while let Ok(request) = inbox.recv() {
        match request {
            Request::Get { key, reply } => {
                let outcome = kv.get(&key);
                publish();
                reply.send(outcome);
            }
            Request::Put { key, value, reply } => {
                let outcome = kv.put(&key, &value);
                publish();
                reply.send(outcome);
            }
            Request::Insert { key, value, reply } => {
                let outcome = kv.insert(&key, &value);
                publish();
                reply.send(outcome);
            }
            Request::Update { key, value, reply } => {
                let outcome = kv.update(&key, &value);
                publish();
                reply.send(outcome);
            }
            Request::Delete { key, reply } => {
                let outcome = kv.delete(&key);
                publish();
                reply.send(outcome);
            }
            Request::Close { reply } => return Some(reply),
        }
    }
    None
}

impl fmt::Debug for AsyncKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncKv")
            .field("writer", &self.writer)
            .field("stats", &self.stats())
            .finish()
    }
}

impl ShmStore {
    /// An async client served by a worker thread of its own ([`AsyncKv::connect`]).
    pub fn connect_async(&self) -> impl Future<Output = Result<AsyncKv, KvError>> + Send + use<> {
        AsyncKv::connect(self)
    }
}

#[cfg(feature = "rdma")]
impl crate::RdmaStore {
    /// An async client served by a worker thread of its own ([`AsyncKv::connect`]).
    pub fn connect_async(&self) -> impl Future<Output = Result<AsyncKv, KvError>> + Send + use<> {
        AsyncKv::connect(self)
    }
}
