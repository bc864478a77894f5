use std::fs::File;
use std::os::unix::fs::PermissionsExt;

use swarm_core::Fabric as _;
use swarm_core::header::HeaderError;

use super::*;
use crate::ScratchDir;

const SIZE: u64 = HEADER_SIZE + 4096;

fn scratch() -> ScratchDir {
    ScratchDir::new("swarm-shm-cluster-test").expect("scratch directory")
}

fn create3(dir: &Path) -> ShmCluster {
    ShmCluster::create(dir, 3, SIZE).expect("create cluster")
}

fn node_path(dir: &Path, index: u16) -> PathBuf {
    dir.join(node_file_name(index))
}

/// Opens a cluster with one unusable node, which must open (a majority is left) with
/// exactly that node absent; returns why it is absent.
fn absent_reason(dir: &Path, node: u16) -> ShmError {
    let mut cluster = ShmCluster::open(dir).expect("a majority is usable: the cluster opens");
    assert_eq!(cluster.absent().len(), 1, "{:?}", cluster.absent());
    assert_eq!(cluster.absent()[0].node, NodeId(node));
    assert!(cluster.node(NodeId(node)).is_none());
    assert!(cluster.headers()[usize::from(node)].is_none());
    cluster.absent.remove(0).error
}

/// Overwrites bytes of a node file in place.
fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    let file = OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

/// Rewrites node `index`'s header with `edit` applied, with a valid checksum.
fn rewrite_header(dir: &Path, index: u16, edit: impl FnOnce(&mut NodeHeader)) {
    let path = node_path(dir, index);
    let mut bytes = [0u8; ENCODED_LEN];
    File::open(&path)
        .unwrap()
        .read_exact_at(&mut bytes, 0)
        .unwrap();
    let mut header = NodeHeader::decode(&bytes, fs::metadata(&path).unwrap().len()).unwrap();
    edit(&mut header);
    patch(&path, 0, &header.encode());
}

#[test]
fn create_then_open_roundtrips_the_headers() {
    let dir = scratch();
    let options = CreateOptions {
        tick_ns: 250,
        ..CreateOptions::default()
    };
    let created = ShmCluster::create_with(dir.path(), 3, SIZE, &options).unwrap();
    let opened = ShmCluster::open(dir.path()).unwrap();
    assert_eq!(created.headers(), opened.headers());
    assert_eq!(opened.node_count(), 3);
    assert_eq!(opened.tick_ns(), 250);
    assert_eq!(opened.cluster_id(), created.cluster_id());
    assert!(opened.absent().is_empty());
    for (i, header) in opened.headers().iter().enumerate() {
        let header = header.expect("every node is usable");
        assert_eq!(usize::from(header.node_id), i);
        assert_eq!(header.node_count, 3);
        assert_eq!(header.size, SIZE);
        assert_eq!(header.cluster_id, opened.cluster_id());
        let node = opened.node(NodeId(i as u16)).unwrap();
        assert_eq!(node.size(), SIZE);
        let mode = fs::metadata(node.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "node files are private");
    }
    assert!(opened.node(NodeId(3)).is_none());
    // The epoch is "now" at creation.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(opened.epoch_unix_ns() <= now);
    assert!(now - opened.epoch_unix_ns() < 3_600_000_000_000);
    // No temporary files are left behind.
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
}

#[test]
fn header_is_visible_through_node_memory() {
    let dir = scratch();
    let cluster = create3(dir.path());
    let node = cluster.node(NodeId(1)).unwrap();
    let mut bytes = [0u8; ENCODED_LEN];
    node.read(0, &mut bytes).unwrap();
    assert_eq!(
        NodeHeader::decode(&bytes, SIZE).unwrap(),
        cluster.headers()[1].unwrap()
    );
}

#[test]
fn clusters_get_distinct_ids() {
    let (a, b) = (scratch(), scratch());
    assert_ne!(
        create3(a.path()).cluster_id(),
        create3(b.path()).cluster_id()
    );
}

#[test]
fn create_refuses_an_existing_cluster_unless_overwriting() {
    let dir = scratch();
    let old = ShmCluster::create(dir.path(), 5, SIZE).unwrap();
    assert!(matches!(
        ShmCluster::create(dir.path(), 3, SIZE),
        Err(ShmError::AlreadyExists { .. })
    ));
    // The old cluster is untouched.
    assert_eq!(
        ShmCluster::open(dir.path()).unwrap().cluster_id(),
        old.cluster_id()
    );

    // Overwriting replaces it, removes nodes beyond the new count, and leaves the old
    // mapping usable (the old files were replaced, not truncated).
    let options = CreateOptions {
        overwrite: true,
        ..CreateOptions::default()
    };
    let new = ShmCluster::create_with(dir.path(), 3, SIZE, &options).unwrap();
    assert_ne!(new.cluster_id(), old.cluster_id());
    assert_eq!(ShmCluster::open(dir.path()).unwrap().node_count(), 3);
    assert!(!node_path(dir.path(), 4).exists());
    old.node(NodeId(4))
        .unwrap()
        .write(HEADER_SIZE, &[1; 8])
        .unwrap();
}

#[test]
fn invalid_parameters_are_refused() {
    let dir = scratch();
    for (nodes, size) in [(0, SIZE), (3, HEADER_SIZE), (3, SIZE + 4), (3, 100)] {
        let result = ShmCluster::create(dir.path(), nodes, size);
        assert!(
            matches!(result, Err(ShmError::InvalidConfig(_))),
            "{nodes} {size}"
        );
    }
    let zero_tick = CreateOptions {
        tick_ns: 0,
        ..CreateOptions::default()
    };
    assert!(matches!(
        ShmCluster::create_with(dir.path(), 3, SIZE, &zero_tick),
        Err(ShmError::InvalidConfig(_))
    ));
    // Nothing was created.
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn missing_directory_or_cluster_is_a_clear_error() {
    let dir = scratch();
    let missing = dir.path().join("nope");
    let error = ShmCluster::open(&missing).unwrap_err();
    assert!(matches!(error, ShmError::Io { .. }), "{error}");
    assert!(error.to_string().contains("nope"), "{error}");
    let error = ShmCluster::open(dir.path()).unwrap_err();
    assert!(matches!(error, ShmError::NotACluster { .. }), "{error}");
    assert!(error.to_string().contains("create one"), "{error}");
}

#[test]
fn missing_node_file_is_named() {
    let dir = scratch();
    drop(create3(dir.path()));
    fs::remove_file(node_path(dir.path(), 2)).unwrap();
    let error = absent_reason(dir.path(), 2);
    assert!(
        matches!(&error, ShmError::MissingNode { path, nodes: 3 } if path.ends_with("node-2.swarm")),
        "{error}"
    );
}

#[test]
fn wrong_magic_is_refused() {
    let dir = scratch();
    drop(create3(dir.path()));
    patch(&node_path(dir.path(), 1), 0, b"NOTSWARM");
    let error = absent_reason(dir.path(), 1);
    assert!(
        matches!(&error, ShmError::Header { error: HeaderError::BadMagic, path } if path.ends_with("node-1.swarm")),
        "{error}"
    );
}

#[test]
fn wrong_version_is_refused() {
    let dir = scratch();
    drop(create3(dir.path()));
    patch(&node_path(dir.path(), 0), 8, &7u32.to_le_bytes());
    let error = absent_reason(dir.path(), 0);
    assert!(
        matches!(
            error,
            ShmError::Header {
                error: HeaderError::UnsupportedVersion { found: 7 },
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn bad_checksum_is_refused() {
    let dir = scratch();
    drop(create3(dir.path()));
    // Flip the bits of a byte of the cluster id without fixing the checksum (a
    // fixed value would change nothing when the random id holds it already: one
    // run in 256).
    let path = node_path(dir.path(), 2);
    let mut byte = [0u8; 1];
    File::open(&path)
        .unwrap()
        .read_exact_at(&mut byte, 24)
        .unwrap();
    patch(&path, 24, &[!byte[0]]);
    let error = absent_reason(dir.path(), 2);
    assert!(
        matches!(
            error,
            ShmError::Header {
                error: HeaderError::BadChecksum,
                ..
            }
        ),
        "{error}"
    );
}

/// A header that counts more nodes than there are files is a node added later
/// (module docs, "Added nodes"): the missing slots are absent, not the node.
#[test]
fn a_higher_node_count_in_a_header_means_absent_added_nodes() {
    let dir = scratch();
    drop(create3(dir.path()));
    rewrite_header(dir.path(), 1, |h| h.node_count = 4);
    let error = absent_reason(dir.path(), 3);
    assert!(matches!(error, ShmError::MissingNode { .. }), "{error}");
    assert_eq!(ShmCluster::open(dir.path()).unwrap().node_count(), 4);
}

/// A node added to a running cluster: the next file, opened by every new opener,
/// and reached by a process that opened the cluster before once it admits it (the
/// node count grows); a slot past the next is refused.
#[test]
fn an_added_node_is_opened_and_admitted_online() {
    let dir = scratch();
    let cluster = Arc::new(create3(dir.path()));
    let fabric = cluster.client();
    assert!(matches!(
        ShmCluster::add_node(dir.path(), 4, false),
        Err(ShmError::InvalidConfig(_))
    ));
    let incarnation = ShmCluster::add_node(dir.path(), 3, false).unwrap();
    assert!(matches!(
        ShmCluster::add_node(dir.path(), 3, false),
        Err(ShmError::AlreadyExists { .. })
    ));
    let reopened = ShmCluster::open(dir.path()).unwrap();
    assert_eq!(reopened.node_count(), 4);
    assert!(reopened.absent().is_empty());
    assert_eq!(reopened.incarnation_of(NodeId(3)), Some(incarnation));
    assert_eq!(reopened.headers()[3].unwrap().node_count, 4);
    assert_eq!(reopened.headers()[0].unwrap().node_count, 3);

    assert_eq!(fabric.node_count(), 3, "not admitted yet");
    assert!(matches!(
        cluster.admit(NodeId(3), incarnation ^ 1),
        Err(ShmError::Mismatch { .. })
    ));
    cluster.admit(NodeId(3), incarnation).unwrap();
    assert_eq!(fabric.node_count(), 4);
    swarm_core::block_on(&fabric, async {
        let t = fabric.post(NodeId(3), swarm_core::Batch::write(HEADER_SIZE, vec![9; 8]));
        core::future::poll_fn(|_| fabric.poll(t)).await
    })
    .expect("the admitted node serves");
    let mut byte = [0u8; 8];
    reopened
        .node(NodeId(3))
        .unwrap()
        .read(HEADER_SIZE, &mut byte)
        .unwrap();
    assert_eq!(byte, [9; 8]);
    // A stopped add's file is replaced only when asked to.
    let again = ShmCluster::add_node(dir.path(), 3, true).unwrap();
    assert_ne!(again, incarnation);
    assert!(reopened.node(NodeId(3)).unwrap().is_retired());
}

#[test]
fn node_id_must_match_the_file_name() {
    let dir = scratch();
    drop(create3(dir.path()));
    rewrite_header(dir.path(), 2, |h| h.node_id = 1);
    let error = absent_reason(dir.path(), 2);
    assert!(matches!(error, ShmError::Mismatch { .. }), "{error}");
    assert!(error.to_string().contains("node 1, not node 2"), "{error}");
}

#[test]
fn a_node_of_another_cluster_is_refused() {
    let (a, b) = (scratch(), scratch());
    drop(create3(a.path()));
    drop(create3(b.path()));
    fs::copy(node_path(b.path(), 1), node_path(a.path(), 1)).unwrap();
    let error = absent_reason(a.path(), 1);
    assert!(
        matches!(&error, ShmError::Mismatch { path, .. } if path.ends_with("node-1.swarm")),
        "{error}"
    );
    assert!(error.to_string().contains("another cluster"), "{error}");
}

#[test]
fn a_stray_extra_node_is_refused() {
    let dir = scratch();
    drop(create3(dir.path()));
    fs::copy(node_path(dir.path(), 2), node_path(dir.path(), 3)).unwrap();
    let error = ShmCluster::open(dir.path()).unwrap_err();
    assert!(
        matches!(&error, ShmError::Mismatch { path, .. } if path.ends_with("node-3.swarm")),
        "{error}"
    );
}

#[test]
fn truncated_files_are_refused_before_mapping() {
    let dir = scratch();
    drop(create3(dir.path()));
    let path = node_path(dir.path(), 1);
    let file = OpenOptions::new().write(true).open(&path).unwrap();

    // Shorter than its header says (mapping it would SIGBUS past the end), shorter
    // than a header, empty.
    for len in [SIZE - 8, HEADER_SIZE, HEADER_SIZE - 1, 100, 0] {
        file.set_len(len).unwrap();
        let error = absent_reason(dir.path(), 1);
        assert!(
            matches!(&error, ShmError::Truncated { len: l, path } if *l == len && path.ends_with("node-1.swarm")),
            "{len}: {error}"
        );
    }
}

#[test]
fn an_extended_file_is_refused() {
    let dir = scratch();
    drop(create3(dir.path()));
    let path = node_path(dir.path(), 0);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(SIZE + 8)
        .unwrap();
    let error = absent_reason(dir.path(), 0);
    assert!(matches!(error, ShmError::Mismatch { .. }), "{error}");
    assert!(error.to_string().contains("header says"), "{error}");
}

#[test]
fn a_directory_in_place_of_a_node_is_refused() {
    let dir = scratch();
    drop(create3(dir.path()));
    let path = node_path(dir.path(), 2);
    fs::remove_file(&path).unwrap();
    fs::create_dir(&path).unwrap();
    let error = absent_reason(dir.path(), 2);
    // Opening a directory read-write fails (EISDIR) before the regular-file check.
    assert!(
        matches!(error, ShmError::Io { .. } | ShmError::Mismatch { .. }),
        "{error}"
    );
}

#[test]
fn a_majority_of_unusable_nodes_is_refused_naming_each() {
    let dir = scratch();
    drop(create3(dir.path()));
    fs::remove_file(node_path(dir.path(), 0)).unwrap();
    patch(&node_path(dir.path(), 2), 0, b"NOTSWARM");
    let error = ShmCluster::open(dir.path()).unwrap_err();
    assert!(
        matches!(
            error,
            ShmError::NoMajority {
                usable: 1,
                nodes: 3,
                ..
            }
        ),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("node 0") && message.contains("node 2"),
        "{message}"
    );
}

#[test]
fn a_single_node_cluster_reports_its_nodes_own_error() {
    let dir = scratch();
    drop(ShmCluster::create(dir.path(), 1, SIZE).unwrap());
    patch(&node_path(dir.path(), 0), 0, b"NOTSWARM");
    let error = ShmCluster::open(dir.path()).unwrap_err();
    assert!(
        matches!(
            error,
            ShmError::Header {
                error: HeaderError::BadMagic,
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn an_absent_node_fails_batches_like_a_crashed_node_and_the_rest_serve() {
    let dir = scratch();
    drop(create3(dir.path()));
    fs::remove_file(node_path(dir.path(), 0)).unwrap();
    let cluster = Arc::new(ShmCluster::open(dir.path()).unwrap());
    assert_eq!(
        cluster.header().node_id,
        1,
        "the lowest usable node's header"
    );
    let fabric = cluster.client();
    let dead = fabric.post(NodeId(0), swarm_core::Batch::read(HEADER_SIZE, 8));
    let alive = fabric.post(NodeId(1), swarm_core::Batch::read(HEADER_SIZE, 8));
    assert!(matches!(
        fabric.poll(dead),
        std::task::Poll::Ready(Err(swarm_core::FabricError::NodeFailed { .. }))
    ));
    assert!(matches!(fabric.poll(alive), std::task::Poll::Ready(Ok(_))));
}

#[test]
fn node_file_names_parse_strictly() {
    assert_eq!(parse_node_file_name("node-0.swarm"), Some(0));
    assert_eq!(parse_node_file_name("node-65535.swarm"), Some(65535));
    assert_eq!(parse_node_file_name(&node_file_name(12)), Some(12));
    for bad in [
        "node-.swarm",
        "node-+1.swarm",
        "node-65536.swarm",
        ".node-1.swarm.9.tmp",
        "node-1.swarmx",
    ] {
        assert_eq!(parse_node_file_name(bad), None, "{bad}");
    }
}

#[test]
fn garbage_headers_never_panic() {
    // A deterministic sweep of corruptions over the encoded header: every one makes
    // the node absent with a clear reason, the others serving (the exhaustive decoder
    // properties live in swarm-core).
    let dir = scratch();
    drop(create3(dir.path()));
    let path = node_path(dir.path(), 0);
    let mut pristine = [0u8; ENCODED_LEN];
    File::open(&path)
        .unwrap()
        .read_exact_at(&mut pristine, 0)
        .unwrap();
    for offset in 0..ENCODED_LEN as u64 {
        patch(&path, offset, &[pristine[offset as usize] ^ 0x5A]);
        let opened = ShmCluster::open(dir.path()).expect("two usable nodes remain");
        assert_eq!(
            opened.absent().iter().map(|a| a.node).collect::<Vec<_>>(),
            [NodeId(0)],
            "corruption at byte {offset} accepted"
        );
        patch(&path, offset, &[pristine[offset as usize]]);
    }
    assert!(ShmCluster::open(dir.path()).unwrap().absent().is_empty());
}

#[test]
fn a_retired_node_fails_batches_everywhere_and_a_replacement_is_admitted_online() {
    let dir = scratch();
    let cluster = Arc::new(create3(dir.path()));
    let fabric = cluster.client();
    let write = |f: &ShmFabric, node: u16| {
        swarm_core::block_on(f, async {
            let t = f.post(
                NodeId(node),
                swarm_core::Batch::write(HEADER_SIZE, vec![7; 8]),
            );
            core::future::poll_fn(|_| f.poll(t)).await
        })
    };
    write(&fabric, 1).expect("node 1 serves");
    let old = cluster.incarnation_of(NodeId(1)).unwrap();
    assert!(
        !cluster.memory_lost(NodeId(1), old),
        "serving memory is not lost"
    );

    // Retiring the file fails this process's batches to it at once.
    assert!(ShmCluster::retire_node(dir.path(), 1).unwrap());
    assert!(cluster.node(NodeId(1)).unwrap().is_retired());
    assert!(fabric.memory_lost(NodeId(1), old), "retired memory is lost");
    assert!(
        !fabric.memory_lost(NodeId(1), old ^ 1),
        "only that incarnation"
    );
    assert!(!fabric.memory_lost(NodeId(0), cluster.incarnation_of(NodeId(0)).unwrap()));
    assert!(matches!(
        write(&fabric, 1),
        Err(swarm_core::FabricError::NodeFailed {
            node: NodeId(1),
            ..
        })
    ));
    // A new opener refuses it, naming why, and knows that memory is lost.
    assert!(matches!(
        absent_reason(dir.path(), 1),
        ShmError::Retired { incarnation, .. } if incarnation == old
    ));
    assert!(
        ShmCluster::open(dir.path())
            .unwrap()
            .memory_lost(NodeId(1), old)
    );

    // Replaced by an empty file with a new incarnation, which an opened cluster
    // admits only with exactly that incarnation.
    ShmCluster::replace_node(dir.path(), 1).unwrap();
    let reopened = ShmCluster::open(dir.path()).unwrap();
    let new = reopened.incarnation_of(NodeId(1)).unwrap();
    assert_ne!(new, old);
    assert!(matches!(
        cluster.admit(NodeId(1), new ^ 1),
        Err(ShmError::Mismatch { .. })
    ));
    assert!(
        !reopened.memory_lost(NodeId(1), old),
        "replaced, not known lost"
    );
    let mut declared = ShmCluster::open(dir.path()).unwrap();
    declared.declare_lost(NodeId(1), old);
    assert!(declared.memory_lost(NodeId(1), old) && !declared.memory_lost(NodeId(1), new));
    cluster.admit(NodeId(1), new).unwrap();
    assert_eq!(cluster.incarnation_of(NodeId(1)), Some(new));
    assert!(
        cluster.memory_lost(NodeId(1), old),
        "the old mapping stays lost"
    );
    assert!(
        !cluster.memory_lost(NodeId(1), new),
        "the admitted memory serves"
    );
    write(&fabric, 1).expect("the existing handle reaches the admitted memory");
    let mut byte = [0u8; 8];
    reopened
        .node(NodeId(1))
        .unwrap()
        .read(HEADER_SIZE, &mut byte)
        .unwrap();
    assert_eq!(byte, [7; 8], "the write landed in the new file");
    cluster
        .admit(NodeId(1), new)
        .expect("admitting it again is a no-op");
    // A second replacement needs a fresh open.
    ShmCluster::replace_node(dir.path(), 1).unwrap();
    let third = ShmCluster::open(dir.path())
        .unwrap()
        .incarnation_of(NodeId(1))
        .unwrap();
    assert!(matches!(
        cluster.admit(NodeId(1), third),
        Err(ShmError::InvalidConfig(_))
    ));
    assert!(
        !ShmCluster::retire_node(dir.path(), 5).unwrap(),
        "no such file"
    );
}
