//! SWARM-KV over RDMA memory nodes, as an application embeds it: open the store a
//! cluster file describes, then put, get, update and delete from two threads.
//!
//! ```text
//! cargo run -p swarm-kv --features rdma --example rdma -- CLUSTER_FILE
//! ```
//!
//! The cluster must be running and formatted: `swarm init --rdma HOST:PORT,...`
//! writes the cluster file, `swarm memnode` serves each node and `swarm format`
//! writes the store once (swarm-rdma/README.md has the steps, and soft-RoCE for a
//! machine without RDMA hardware).

use std::path::PathBuf;

use swarm_kv::{DeleteOutcome, KvError, RdmaStore};

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let Some(file) = std::env::args_os().nth(1).map(PathBuf::from) else {
        return Err("usage: rdma CLUSTER_FILE".into());
    };
    // The store is shared by every thread; each thread connects a client of its own.
    let store = RdmaStore::open_cluster_file(&file)?;
    let writer = std::thread::spawn({
        let store = store.clone();
        move || -> Result<(), KvError> {
            let kv = store.connect()?;
            kv.put("example:rdma", "written by another thread")?;
            Ok(())
        }
    });
    writer.join().map_err(|_| "the writer thread panicked")??;

    let kv = store.connect()?;
    let value = kv.get("example:rdma")?;
    println!(
        "get example:rdma -> {:?}",
        value.as_deref().map(String::from_utf8_lossy)
    );
    assert!(kv.update("example:rdma", "updated")?);
    let outcome = kv.delete("example:rdma")?;
    assert!(matches!(
        outcome,
        DeleteOutcome::Removed | DeleteOutcome::Raced
    ));
    let stats = kv.stats();
    println!(
        "writer {}: {} operations, {:.2} roundtrips each",
        kv.writer(),
        stats.operations(),
        stats.roundtrips_per_operation()
    );
    kv.close();
    Ok(())
}
