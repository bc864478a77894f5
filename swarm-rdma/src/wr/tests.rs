//! Tests of chain planning.

use super::*;
use proptest::prelude::*;
use swarm_core::Fabric;
use swarm_core::MemCluster;

const NODE: NodeId = NodeId(2);
const REGION: RemoteRegion = RemoteRegion {
    addr: 0x7f00_0000_1000,
    rkey: 0xabcd,
    size: 4096,
};
const LIMITS: ChainLimits = ChainLimits {
    max_inline: 64,
    max_message: 1 << 30,
    ordering: ReadOrdering::Concurrent,
    cas_reply: CasReplyOrder::Native,
};

fn batch(ops: Vec<Op>) -> Batch {
    let mut batch = Batch::new();
    for op in ops {
        batch.push(op).unwrap();
    }
    batch
}

fn read(addr: u64, len: u32) -> Op {
    Op::Read { addr, len }
}
fn write(addr: u64, len: usize) -> Op {
    Op::Write {
        addr,
        data: vec![0x5a; len].into(),
    }
}
fn cas(addr: u64) -> Op {
    Op::Cas {
        addr,
        expected: 1,
        new: 2,
    }
}

fn flags(chain: &Chain) -> Vec<SendFlags> {
    chain.requests().iter().map(|wr| wr.flags).collect()
}

const F: SendFlags = SendFlags::FENCE;
const S: SendFlags = SendFlags::SIGNALED;
const I: SendFlags = SendFlags::INLINE;
const NONE: SendFlags = SendFlags::empty();

#[test]
fn flag_bits_match_verbs() {
    use rdma_sys::ibv_send_flags as v;
    assert_eq!(SendFlags::FENCE.bits(), v::IBV_SEND_FENCE.0);
    assert_eq!(SendFlags::SIGNALED.bits(), v::IBV_SEND_SIGNALED.0);
    assert_eq!(SendFlags::INLINE.bits(), v::IBV_SEND_INLINE.0);
}

#[test]
fn in_n_out_write_then_cas_needs_no_fence_and_signals_last() {
    // SWARM §4.2: the out-of-place buffer, then the metadata CAS.
    let chain = plan(NODE, &batch(vec![write(64, 200), cas(8)]), &REGION, &LIMITS).unwrap();
    let wrs = chain.requests();
    assert_eq!(wrs[0].opcode, Opcode::Write);
    assert_eq!(wrs[1].opcode, Opcode::CompareSwap);
    assert_eq!(flags(&chain), vec![NONE, S]);
    assert_eq!((wrs[1].compare, wrs[1].swap), (1, 2));
    assert!(wrs.iter().all(|wr| wr.rkey == REGION.rkey));
}

#[test]
fn safe_guess_write_batch_is_unfenced_unless_strict() {
    // SWARM §3.2: read the metadata ∥ write the buffer, then CAS the metadata.
    let b = batch(vec![read(8, 64), write(128, 32), cas(8)]);
    let concurrent = plan(NODE, &b, &REGION, &LIMITS).unwrap();
    assert_eq!(flags(&concurrent), vec![NONE, I, S]);
    let strict = ChainLimits {
        ordering: ReadOrdering::Strict,
        ..LIMITS
    };
    let strict = plan(NODE, &b, &REGION, &strict).unwrap();
    // The write waits for the read; the CAS is behind that fence already.
    assert_eq!(flags(&strict), vec![NONE, I | F, S]);
}

#[test]
fn everything_after_an_atomic_is_fenced_once() {
    let chain = plan(
        NODE,
        &batch(vec![cas(0), write(64, 8), write(80, 8), cas(16)]),
        &REGION,
        &LIMITS,
    )
    .unwrap();
    // The last CAS follows the fenced write: it is behind the first CAS already.
    assert_eq!(flags(&chain), vec![NONE, I | F, I, S]);
    let chain = plan(NODE, &batch(vec![cas(0), cas(8)]), &REGION, &LIMITS).unwrap();
    assert_eq!(flags(&chain), vec![NONE, F | S]);
    let chain = plan(
        NODE,
        &batch(vec![write(0, 8), cas(8), read(0, 16)]),
        &REGION,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(flags(&chain), vec![I, NONE, F | S]);
}

#[test]
fn reads_and_writes_after_writes_are_not_fenced() {
    let chain = plan(
        NODE,
        &batch(vec![write(0, 8), read(0, 8), read(8, 8), write(16, 8)]),
        &REGION,
        &LIMITS,
    )
    .unwrap();
    assert_eq!(flags(&chain), vec![I, NONE, NONE, I | S]);
}

#[test]
fn inline_threshold_and_zero_lengths() {
    let chain = plan(
        NODE,
        &batch(vec![
            write(0, 64),
            write(64, 65),
            write(200, 0),
            read(300, 0),
        ]),
        &REGION,
        &LIMITS,
    )
    .unwrap();
    let wrs = chain.requests();
    assert_eq!(wrs[0].local, Local::Inline);
    assert!(wrs[0].flags.contains(I));
    assert_eq!(wrs[1].local, Local::Staged { offset: 0, len: 65 });
    assert!(!wrs[1].flags.contains(I));
    assert_eq!(wrs[2].local, Local::None);
    assert_eq!(wrs[3].local, Local::None);
    assert_eq!(chain.staging_len(), 72);
    let never_inline = ChainLimits {
        max_inline: 0,
        ..LIMITS
    };
    let chain = plan(NODE, &batch(vec![write(0, 1)]), &REGION, &never_inline).unwrap();
    assert_eq!(
        chain.requests()[0].local,
        Local::Staged { offset: 0, len: 1 }
    );
}

#[test]
fn staging_slots_are_aligned_and_disjoint() {
    let chain = plan(
        NODE,
        &batch(vec![read(0, 3), cas(8), read(16, 13), cas(24)]),
        &REGION,
        &LIMITS,
    )
    .unwrap();
    let slots: Vec<_> = chain.requests().iter().map(|wr| wr.local).collect();
    assert_eq!(
        slots,
        vec![
            Local::Staged { offset: 0, len: 3 },
            Local::Staged { offset: 8, len: 8 },
            Local::Staged {
                offset: 16,
                len: 13
            },
            Local::Staged { offset: 32, len: 8 },
        ]
    );
    assert_eq!(chain.staging_len(), 40);
}

#[test]
fn addresses_are_translated_and_bounds_checked() {
    let chain = plan(NODE, &batch(vec![read(4088, 8)]), &REGION, &LIMITS).unwrap();
    assert_eq!(chain.requests()[0].remote_addr, REGION.addr + 4088);
    for bad in [read(4089, 8), write(4095, 2), read(u64::MAX, 1)] {
        assert!(matches!(
            plan(NODE, &batch(vec![bad]), &REGION, &LIMITS),
            Err(FabricError::OutOfBounds { node: NODE, .. })
        ));
    }
    assert!(matches!(
        plan(NODE, &batch(vec![cas(12)]), &REGION, &LIMITS),
        Err(FabricError::Misaligned {
            node: NODE,
            addr: 12
        })
    ));
    // One bad operation rejects the whole batch: nothing is half-posted.
    assert!(
        plan(
            NODE,
            &batch(vec![write(0, 8), read(5000, 8)]),
            &REGION,
            &LIMITS
        )
        .is_err()
    );
    let small = ChainLimits {
        max_message: 16,
        ..LIMITS
    };
    assert!(matches!(
        plan(NODE, &batch(vec![read(0, 17)]), &REGION, &small),
        Err(FabricError::OutOfBounds { size: 16, .. })
    ));
    // A region at the very top of the address space cannot wrap.
    let top = RemoteRegion {
        addr: u64::MAX - 100,
        ..REGION
    };
    assert!(top.translate(NODE, 200, 8).is_err());
}

#[test]
fn wr_ids_roundtrip() {
    for (seq, index) in [(0, 0), (1, 3), (u64::MAX >> WR_INDEX_BITS, 2)] {
        assert_eq!(split_wr_id(wr_id(seq, index)), (seq, index));
    }
}

#[test]
fn empty_batch_plans_nothing() {
    let chain = plan(NODE, &Batch::new(), &REGION, &LIMITS).unwrap();
    assert!(chain.is_empty());
    assert_eq!(chain.complete(&[]), Completion::new());
}

/// Executes a chain the way an RC responder and requester would, on `memory`
/// (the remote region's bytes) and `staging`, strictly in chain order.
fn execute(batch: &Batch, chain: &Chain, memory: &mut [u8], staging: &mut [u8]) {
    for wr in chain.requests() {
        let at = (wr.remote_addr - REGION.addr) as usize;
        match (wr.opcode, wr.local) {
            (Opcode::Read, Local::Staged { offset, len }) => {
                let offset = offset as usize;
                staging[offset..offset + len as usize]
                    .copy_from_slice(&memory[at..at + len as usize]);
            }
            (Opcode::Write, Local::Inline) => {
                let Op::Write { data, .. } = &batch.ops()[wr.op] else {
                    unreachable!()
                };
                memory[at..at + data.len()].copy_from_slice(data);
            }
            (Opcode::Write, Local::Staged { offset, len }) => {
                let offset = offset as usize;
                memory[at..at + len as usize]
                    .copy_from_slice(&staging[offset..offset + len as usize]);
            }
            (Opcode::CompareSwap, Local::Staged { offset, .. }) => {
                let word = u64::from_le_bytes(memory[at..at + 8].try_into().unwrap());
                if word == wr.compare {
                    memory[at..at + 8].copy_from_slice(&wr.swap.to_le_bytes());
                }
                let offset = offset as usize;
                staging[offset..offset + 8].copy_from_slice(&word.to_ne_bytes());
            }
            (_, Local::None) => {}
            other => panic!("impossible request shape {other:?}"),
        }
    }
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..4096, 0u32..300).prop_map(|(addr, len)| Op::Read { addr, len }),
        (0u64..4096, proptest::collection::vec(any::<u8>(), 0..300)).prop_map(|(addr, data)| {
            Op::Write {
                addr,
                data: data.into(),
            }
        }),
        (0u64..520, 0u64..3, 0u64..3).prop_map(|(w, expected, new)| Op::Cas {
            addr: w * 8,
            expected,
            new
        }),
    ]
}

proptest! {
    /// Planning, staging and completion assembly agree with the in-process
    /// reference fabric on random batches (including out-of-bounds ones).
    #[test]
    fn chain_execution_matches_the_reference_fabric(
        ops in proptest::collection::vec(arb_op(), 0..=4),
        max_inline in 0u32..128,
    ) {
        let b = batch(ops);
        let limits = ChainLimits { max_inline, ..LIMITS };
        let reference = MemCluster::new(3, REGION.size as usize).client();
        let ticket = reference.post(NODE, b.clone());
        let std::task::Poll::Ready(expected) = reference.poll(ticket) else {
            panic!("the reference fabric completes synchronously")
        };
        match plan(NODE, &b, &REGION, &limits) {
            Err(error) => prop_assert_eq!(Err(error), expected),
            Ok(chain) => {
                let mut memory = vec![0u8; REGION.size as usize];
                let mut staging = vec![0u8; chain.staging_len() as usize];
                chain.fill_staging(&b, &mut staging);
                execute(&b, &chain, &mut memory, &mut staging);
                prop_assert_eq!(Ok(chain.complete(&staging)), expected);
                let signaled = chain.requests().iter()
                    .filter(|wr| wr.flags.contains(SendFlags::SIGNALED)).count();
                prop_assert_eq!(signaled, usize::from(!b.is_empty()));
            }
        }
    }
}
