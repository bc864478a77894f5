//! The blocking client from two threads: create a store in a temporary directory,
//! then put, get, update and delete.
//!
//! ```text
//! cargo run -p swarm-kv --example blocking
//! ```

use std::path::PathBuf;

use swarm_kv::{ClusterParams, DeleteOutcome, KvError, ShmStore};

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // Node files belong on a memory filesystem: /dev/shm where there is one.
    let base = PathBuf::from("/dev/shm");
    let base = if base.is_dir() {
        base
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("swarm-kv-example-{}", std::process::id()));
    let outcome = run(&dir);
    // The store is gone with its handles; remove its files whatever happened.
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

fn run(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // Three memory nodes of 32 MiB: values up to 256 B, keys up to 64 B.
    let params = ClusterParams {
        value_max: 256,
        key_max: 64,
        ..ClusterParams::default()
    };
    let store = ShmStore::create(dir, 3, 32 << 20, params)?;
    println!("created a 3-node store in {}", dir.display());

    // Two threads, each with its own client, write disjoint keys and read each
    // other's.
    let threads: Vec<_> = ["left", "right"]
        .into_iter()
        .map(|name| {
            let store = store.clone();
            std::thread::spawn(move || -> Result<u64, KvError> {
                let kv = store.connect()?;
                for i in 0..100 {
                    kv.put(format!("{name}:{i}"), format!("value {i} from {name}"))?;
                }
                let stats = kv.stats();
                println!(
                    "{name}: writer {}, {} puts in {} roundtrips",
                    kv.writer(),
                    stats.puts,
                    stats.roundtrips
                );
                Ok(stats.puts)
            })
        })
        .collect();
    for thread in threads {
        thread.join().map_err(|_| "a writer thread panicked")??;
    }

    let kv = store.connect()?;
    let value = kv.get("right:7")?.ok_or("right:7 is missing")?;
    println!("get right:7 -> {}", String::from_utf8_lossy(&value));
    assert!(kv.update("right:7", "changed")?, "right:7 is present");
    assert!(!kv.update("nowhere", "x")?, "update does not insert");
    assert_eq!(kv.get("right:7")?.as_deref(), Some(&b"changed"[..]));
    assert_eq!(kv.delete("right:7")?, DeleteOutcome::Removed);
    assert_eq!(kv.delete("right:7")?, DeleteOutcome::Absent);
    assert_eq!(kv.get("right:7")?, None);
    let stats = kv.stats();
    println!(
        "main: {} operations, {:.2} roundtrips per operation",
        stats.operations(),
        stats.roundtrips_per_operation()
    );
    kv.close();
    println!("blocking example: ok");
    Ok(())
}
