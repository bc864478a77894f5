//! The multi-client runner and the virtual clocks: closed-loop clients, tasks spawned
//! later, sleeps, livelock detection, and timestamp clocks with skew.

use std::cell::RefCell;
use std::rc::Rc;

use swarm_core::Clock;
use swarm_core::fabric::Fabric;
use swarm_core::{Batch, NodeId, OpStats, Roundtrip};
use swarm_sim::{CLOCK_EPOCH_NS, SimClock, SimError, SimFabric, SimRunner, SimWorld};

async fn read(fabric: &SimFabric, node: u16) {
    let stats = OpStats::new();
    let mut step = Roundtrip::start(fabric, &stats);
    step.post(NodeId(node), Batch::read(0, 8)).unwrap();
    step.wait(1).await.unwrap();
}

#[test]
fn closed_loop_clients_run_their_operations_in_sequence() {
    let world = SimWorld::with_seed(3);
    let mut runner = SimRunner::new(&world);
    let log = Rc::new(RefCell::new(Vec::new()));
    for c in 0..3u16 {
        let client = world.client();
        let log = log.clone();
        runner.spawn(client.id(), async move {
            for op in 0..4 {
                let start = client.now();
                read(&client, c).await;
                log.borrow_mut().push((c, op, start, client.now()));
            }
        });
    }
    let report = runner.run().unwrap();
    assert_eq!(report.finished, 3);
    let log = log.borrow();
    assert_eq!(log.len(), 12);
    for c in 0..3 {
        let mine: Vec<_> = log.iter().filter(|e| e.0 == c).collect();
        // Each operation starts when the previous one ended and takes a roundtrip.
        for pair in mine.windows(2) {
            assert_eq!(pair[1].1, pair[0].1 + 1);
            assert_eq!(pair[1].2, pair[0].3);
        }
        assert!(mine.iter().all(|e| e.3 - e.2 >= 1_400));
    }
    // Clients run concurrently: the three first operations overlap in time.
    let firsts: Vec<_> = log.iter().filter(|e| e.1 == 0).collect();
    assert!(firsts.iter().all(|e| e.2 == 0));
    assert!(report.events > 0 && report.now == world.now());

    // A second run counts only its own work.
    let client = world.client();
    runner.spawn(client.id(), async move { read(&client, 0).await });
    let again = runner.run().unwrap();
    assert_eq!((again.finished, again.cancelled), (1, 0));
    assert!(again.events < report.events);
}

#[test]
fn tasks_can_be_spawned_later_and_from_tasks() {
    let world = SimWorld::with_seed(4);
    let mut runner = SimRunner::new(&world);
    let spawner = runner.spawner();
    let client = world.client();
    let id = client.id();
    let late = runner.spawn_at(50_000, id, {
        let world = world.clone();
        async move { world.now() }
    });
    let child = Rc::new(RefCell::new(None));
    let slot = child.clone();
    runner.spawn(id, async move {
        read(&client, 0).await;
        // Issue the next operation as a new task.
        let next = client.clone();
        *slot.borrow_mut() = Some(spawner.spawn(next.id(), async move {
            read(&next, 1).await;
            next.now()
        }));
    });
    let report = runner.run().unwrap();
    assert_eq!(report.finished, 3);
    assert_eq!(late.take(), Some(50_000), "started exactly at its time");
    let child = child.borrow_mut().take().unwrap();
    assert!(
        child.take().unwrap() > 2_000,
        "ran after its parent's roundtrip"
    );
}

#[test]
fn sleeps_advance_virtual_time_only() {
    let world = SimWorld::with_seed(5);
    let mut runner = SimRunner::new(&world);
    let client = world.client();
    let woke = runner.spawn(client.id(), async move {
        client.sleep(1_000_000).await;
        client.now()
    });
    let wall = std::time::Instant::now();
    runner.run().unwrap();
    assert_eq!(woke.take(), Some(1_000_000));
    assert!(wall.elapsed().as_secs() < 1);
}

#[test]
fn a_livelock_hits_the_time_limit() {
    let world = SimWorld::with_seed(6);
    let mut runner = SimRunner::new(&world);
    let client = world.client();
    let id = client.id();
    runner.spawn(id, async move {
        loop {
            read(&client, 0).await;
        }
    });
    runner.time_limit(200_000);
    match runner.run() {
        Err(SimError::TimeLimit {
            seed,
            limit,
            tasks,
            clients,
        }) => {
            assert_eq!((seed, limit, tasks), (6, 200_000, 1));
            assert_eq!(clients, vec![id]);
        }
        other => panic!("expected the time limit, got {other:?}"),
    }
    assert!(world.now() > 200_000 && world.now() < 210_000);
}

#[test]
#[should_panic(expected = "assertion inside a task")]
fn a_panicking_task_fails_the_run() {
    let world = SimWorld::with_seed(8);
    let mut runner = SimRunner::new(&world);
    let client = world.client();
    runner.spawn(client.id(), async move {
        read(&client, 0).await;
        panic!("assertion inside a task");
    });
    let _ = runner.run();
}

#[test]
fn clocks_follow_virtual_time_with_skew() {
    let world = SimWorld::with_seed(9);
    let on_time = SimClock::new(&world, 100);
    let behind = SimClock::new(&world, 100).with_skew(-50_000);
    let ahead = SimClock::new(&world, 100).with_skew(50_000);
    assert_eq!(on_time.ticks(), CLOCK_EPOCH_NS / 100);
    assert_eq!(ahead.ticks() - on_time.ticks(), 500);
    assert_eq!(on_time.ticks() - behind.ticks(), 500);

    world.advance_to(1_000_000);
    assert_eq!(on_time.ticks(), (CLOCK_EPOCH_NS + 1_000_000) / 100);
    // A lagging clock guesses timestamps older than ones already issued.
    let issued_ahead = ahead.ticks();
    world.advance_to(1_010_000);
    assert!(behind.ticks() < issued_ahead);
    behind.set_skew(0);
    assert_eq!(behind.ticks(), on_time.ticks());
    assert_eq!((behind.skew(), behind.tick_ns()), (0, 100));
    // Far behind the epoch saturates at zero rather than wrapping.
    assert_eq!(SimClock::new(&world, 1).with_skew(i64::MIN).ticks(), 0);
}
