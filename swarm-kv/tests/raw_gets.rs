//! SWARM-KV over the RAW register protocol (the unreplicated baseline of SWARM §7):
//! a get of a cached key is one READ of the primary on shared memory
//! (`Client::raw_read_now_with`, through `KvClient::get_now`), and it returns what the
//! last update wrote, and nothing for a key never inserted. (RAW has no deletes.)

use swarm_core::{OpStats, block_on};
use swarm_kv::admin::RegisterProtocol;
use swarm_kv::{ClusterParams, ShmStore};
use swarm_shm::ScratchDir;

#[test]
fn raw_gets_of_cached_keys_take_one_roundtrip_and_return_the_last_write() {
    let dir = ScratchDir::new("kv-raw-gets").unwrap();
    let params = ClusterParams {
        key_max: 32,
        value_max: 64,
        writers: 4,
        ..ClusterParams::default()
    };
    let store = ShmStore::create(dir.path(), 3, 16 << 20, params).expect("create");
    let mut config = store.config();
    config.register_protocol = RegisterProtocol::Raw;
    let client = store.client_with(config).unwrap();
    let fabric = client.fabric();
    let key = |i: u32| format!("raw-key-{i}");
    let value = |i: u32, round: u32| format!("value {i} of round {round}");
    for i in 0..8 {
        let stats = OpStats::new();
        block_on(
            fabric,
            client.insert(key(i).as_bytes(), value(i, 0).as_bytes(), &stats),
        )
        .unwrap();
    }
    for round in 1..4 {
        for i in 0..8 {
            let stats = OpStats::new();
            let present = block_on(
                fabric,
                client.update(key(i).as_bytes(), value(i, round).as_bytes(), &stats),
            )
            .unwrap();
            assert!(present, "key {i} round {round}");
        }
        for i in 0..8 {
            let stats = OpStats::new();
            let got = block_on(fabric, client.get(key(i).as_bytes(), &stats)).unwrap();
            assert_eq!(got.as_deref(), Some(value(i, round).as_bytes()), "key {i}");
            assert_eq!(stats.roundtrips(), 1, "a cached RAW get is one READ");
            let mut into = Vec::new();
            let stats = OpStats::new();
            assert!(
                block_on(
                    fabric,
                    client.get_into(key(i).as_bytes(), &mut into, &stats)
                )
                .unwrap()
            );
            assert_eq!(into, value(i, round).as_bytes(), "key {i} into a buffer");
        }
    }
    let stats = OpStats::new();
    let got = block_on(fabric, client.get(key(4).as_bytes(), &stats)).unwrap();
    assert_eq!(got.as_deref(), Some(value(4, 3).as_bytes()));
    let stats = OpStats::new();
    assert_eq!(
        block_on(fabric, client.get(b"never-inserted", &stats)).unwrap(),
        None
    );
}
