//! The async client under tokio: a few tasks share one [`swarm_kv::AsyncKv`] and a
//! second client runs next to it.
//!
//! ```text
//! cargo run -p swarm-kv --example tokio
//! ```
//!
//! Each `AsyncKv` is served by a worker thread of its own (see its docs for the cost
//! model); the tasks await its answers without blocking tokio's threads.

use std::path::PathBuf;
use std::sync::Arc;

use swarm_kv::{AsyncKv, ClusterParams, DeleteOutcome, KvError, ShmStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let base = PathBuf::from("/dev/shm");
    let base = if base.is_dir() {
        base
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("swarm-kv-tokio-example-{}", std::process::id()));
    let outcome = run(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

async fn run(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // Creating a store touches files: a blocking call, done once at start-up.
    let store = ShmStore::create(dir, 3, 32 << 20, ClusterParams::default())?;
    let kv = Arc::new(store.connect_async().await?);

    // Eight tasks share one client: their operations queue on its worker.
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let kv = Arc::clone(&kv);
            tokio::spawn(async move {
                for i in 0..25 {
                    kv.put(format!("task{task}:{i}"), format!("{}", task * 100 + i))
                        .await?;
                }
                Ok::<_, KvError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }

    // A second client (a second worker thread and writer id) sees the same data.
    let other: AsyncKv = store.connect_async().await?;
    let (a, b) = tokio::join!(other.get("task3:4"), kv.get("task5:24"));
    println!(
        "task3:4 -> {:?}, task5:24 -> {:?}",
        a?.as_deref().map(String::from_utf8_lossy),
        b?.as_deref().map(String::from_utf8_lossy)
    );
    assert!(other.update("task3:4", "304!").await?);
    assert_eq!(kv.get("task3:4").await?.as_deref(), Some(&b"304!"[..]));
    assert_eq!(kv.delete("task3:4").await?, DeleteOutcome::Removed);
    assert_eq!(other.get("task3:4").await?, None);

    let stats = kv.stats();
    println!(
        "shared client: writer {}, {} operations, {:.2} roundtrips per operation",
        kv.writer(),
        stats.operations(),
        stats.roundtrips_per_operation()
    );
    // Closing waits for the writer ids to be given back.
    other.close().await;
    if let Ok(kv) = Arc::try_unwrap(kv) {
        kv.close().await;
    }
    println!("tokio example: ok");
    Ok(())
}
