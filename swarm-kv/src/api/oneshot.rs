//! A one-value channel from a worker thread to a future: how an [`crate::AsyncKv`]
//! operation's result comes back. Hand-written (a mutex, a value and a waker) so that
//! the crate depends on no async runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

struct State<T> {
    value: Option<T>,
    waker: Option<Waker>,
    /// The sender is gone (it sent, or was dropped without sending).
    closed: bool,
}

/// The sending half: [`Sender::send`] once, or drop it to tell the receiver that no
/// value will come.
pub(crate) struct Sender<T>(Arc<Mutex<State<T>>>);

/// The receiving half: a future of `Some(value)`, or `None` if the sender was dropped
/// without sending.
pub(crate) struct Receiver<T>(Arc<Mutex<State<T>>>);

/// A connected pair.
pub(crate) fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let state = Arc::new(Mutex::new(State {
        value: None,
        waker: None,
        closed: false,
    }));
    (Sender(Arc::clone(&state)), Receiver(state))
}

impl<T> Sender<T> {
    /// Hands `value` to the receiver and wakes its task.
    pub(crate) fn send(self, value: T) {
        self.close(Some(value));
    }

    fn close(&self, value: Option<T>) {
        // A panic while the lock was held (never in this module) cannot leave the
        // state inconsistent: every field is written whole.
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            return;
        }
        state.closed = true;
        state.value = value;
        let waker = state.waker.take();
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.close(None);
    }
}

impl<T> Future for Receiver<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            return Poll::Ready(state.value.take());
        }
        match &mut state.waker {
            Some(waker) => waker.clone_from(cx.waker()),
            None => state.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::Wake;
    use std::thread::Thread;

    struct Unpark(Thread);

    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }

    /// Runs `future` on the calling thread, parking it while the future is pending.
    pub(crate) fn wait<F: Future>(future: F) -> F::Output {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut future = std::pin::pin!(future);
        loop {
            if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
                return value;
            }
            std::thread::park();
        }
    }

    #[test]
    fn a_value_sent_from_another_thread_arrives() {
        let (tx, rx) = channel();
        let worker = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            tx.send(42u32);
        });
        assert_eq!(wait(rx), Some(42));
        worker.join().expect("the sender thread");
    }

    #[test]
    fn a_dropped_sender_ends_the_wait_with_none() {
        let (tx, rx) = channel::<u32>();
        let worker = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(tx);
        });
        assert_eq!(wait(rx), None);
        worker.join().expect("the sender thread");
    }
}
