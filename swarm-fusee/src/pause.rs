//! Waiting on the fabric's clock without a runtime: what FUSEE's "sleep a little bit"
//! (Algorithm 1, line 18) and the master's waits become under a caller-driven executor.

use core::future::poll_fn;
use core::task::Poll;

use swarm_core::Fabric;
use swarm_core::fabric::Nanos;

/// Completes once the fabric's clock passed `ns` from now. Registers the deadline with
/// [`Fabric::wake_at`], so executors keep driving the fabric (and a simulated fabric
/// advances its virtual time) instead of reporting a stall.
pub async fn pause<F: Fabric + ?Sized>(fabric: &F, ns: Nanos) {
    let deadline = fabric.now().saturating_add(ns);
    fabric.wake_at(deadline);
    poll_fn(|cx| {
        if fabric.now() >= deadline {
            Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}
