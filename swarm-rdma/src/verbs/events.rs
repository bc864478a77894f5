//! Asynchronous device events: a dead device or a port that went down.
//!
//! Completion queues report what happened to the requests a client posted; they say
//! nothing when the *device* dies (`IBV_EVENT_DEVICE_FATAL`) or its port loses the
//! link (`IBV_EVENT_PORT_ERR`). After either, requests may never complete at all,
//! and a client that only polls its completion queue would spin forever waiting for
//! a majority. libibverbs delivers those events on the device context's
//! asynchronous event file descriptor; [`DeviceEvents`] watches it on a thread and
//! publishes what it learnt in a [`DeviceHealth`] that every client thread checks
//! with one atomic load per progress call.
//!
//! What the fabric does with it ([`crate::fabric`]): on a port error it fails every
//! memory node at once (their queue pairs are dead) and reconnects them once the
//! port is active again; on a fatal device error it fails them for good (the
//! process must reopen the device: restart it).

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use rdma_sys::{ibv_ack_async_event, ibv_async_event, ibv_get_async_event};

use crate::error::RdmaError;
use crate::verbs::device::Device;

/// How long the watcher sleeps in `poll` before checking whether to stop.
const POLL_MS: i32 = 100;

/// What an asynchronous event means for the transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventEffect {
    /// The device is unusable until it is reopened.
    DeviceFatal,
    /// The port lost its link (or was reset): its queue pairs are unusable.
    PortDown(u8),
    /// The port is active again: new queue pairs can be connected.
    PortUp(u8),
    /// Something about one queue pair, completion queue or the fabric's
    /// management; its requests report it through their completions, if at all.
    Informational,
}

/// Classifies an `ibv_event_type` code (read as a plain integer: a newer kernel may
/// report codes this build does not know, which are informational).
pub fn classify(event_type: u32, port: i32) -> EventEffect {
    // Values of `enum ibv_event_type` (verbs.h).
    const DEVICE_FATAL: u32 = 8;
    const PORT_ACTIVE: u32 = 9;
    const PORT_ERR: u32 = 10;
    let port = u8::try_from(port).unwrap_or(0);
    match event_type {
        DEVICE_FATAL => EventEffect::DeviceFatal,
        PORT_ERR => EventEffect::PortDown(port),
        PORT_ACTIVE => EventEffect::PortUp(port),
        _ => EventEffect::Informational,
    }
}

/// What a process knows about its device's health; shared by its client threads.
#[derive(Debug)]
pub struct DeviceHealth {
    port: u8,
    /// Bumped at every change below, so a client notices with one load.
    generation: AtomicU64,
    fatal: AtomicBool,
    port_down: AtomicBool,
}

impl DeviceHealth {
    /// A healthy device whose port `port` is in use.
    pub fn new(port: u8) -> Self {
        Self {
            port,
            generation: AtomicU64::new(0),
            fatal: AtomicBool::new(false),
            port_down: AtomicBool::new(false),
        }
    }

    /// Changes at every event that matters; compare with the last value seen.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the device had a fatal error.
    pub fn is_fatal(&self) -> bool {
        self.fatal.load(Ordering::Acquire)
    }

    /// Whether queue pairs can be used (device alive, port up).
    pub fn is_usable(&self) -> bool {
        !self.is_fatal() && !self.port_down.load(Ordering::Acquire)
    }

    /// Records an event's effect; whether it changed anything.
    pub fn record(&self, effect: EventEffect) -> bool {
        let changed = match effect {
            EventEffect::DeviceFatal => !self.fatal.swap(true, Ordering::AcqRel),
            EventEffect::PortDown(port) if port == self.port => {
                !self.port_down.swap(true, Ordering::AcqRel)
            }
            EventEffect::PortUp(port) if port == self.port => {
                self.port_down.swap(false, Ordering::AcqRel)
            }
            _ => false,
        };
        if changed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        changed
    }
}

/// The thread that watches a device's asynchronous events; stopped on drop.
#[derive(Debug)]
pub struct DeviceEvents {
    health: Arc<DeviceHealth>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DeviceEvents {
    /// Starts watching `device`'s events for port `port`.
    pub fn start(device: Arc<Device>, port: u8) -> Result<Self, RdmaError> {
        let fd = device.async_fd();
        set_nonblocking(fd)?;
        let health = Arc::new(DeviceHealth::new(port));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (health, stop) = (health.clone(), stop.clone());
            std::thread::Builder::new()
                .name("swarm-rdma-events".into())
                .spawn(move || watch(&device, fd, &health, &stop))
                .map_err(|e| RdmaError::io("cannot start the device event thread", e))?
        };
        Ok(Self {
            health,
            stop,
            thread: Some(thread),
        })
    }

    /// The health this watcher keeps up to date.
    pub fn health(&self) -> &Arc<DeviceHealth> {
        &self.health
    }
}

impl Drop for DeviceEvents {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn set_nonblocking(fd: RawFd) -> Result<(), RdmaError> {
    // SAFETY: fcntl on a descriptor the device context owns; F_GETFL/F_SETFL only
    // read and change its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(RdmaError::io(
            "cannot make the device's event descriptor non-blocking",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn watch(device: &Device, fd: RawFd, health: &DeviceHealth, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let mut pollfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut pollfd, 1, POLL_MS) };
        if ready <= 0 {
            continue;
        }
        let mut event = std::mem::MaybeUninit::<ibv_async_event>::uninit();
        // SAFETY: the context is open (we hold the device); `event` is a valid
        // out-pointer; the descriptor is non-blocking, so this returns at once.
        if unsafe { ibv_get_async_event(device.context(), event.as_mut_ptr()) } != 0 {
            continue;
        }
        let event_ptr = event.as_mut_ptr();
        // SAFETY: filled by the successful call above. The event type is read as
        // a plain u32 (its C type is an enum that may grow; the Rust binding's
        // enum would be undefined behaviour for an unknown value), and the element
        // union's port number only means something for port events.
        let (event_type, port) = unsafe {
            let event_type = std::ptr::addr_of!((*event_ptr).event_type)
                .cast::<u32>()
                .read();
            let port = (*event_ptr).element.port_num;
            (event_type, port)
        };
        // SAFETY: every event returned by ibv_get_async_event is acked once.
        unsafe { ibv_ack_async_event(event_ptr) };
        let effect = classify(event_type, port);
        match effect {
            EventEffect::DeviceFatal => tracing::error!(
                device = device.name(),
                "RDMA device fatal error: every memory node is unreachable until the process restarts"
            ),
            EventEffect::PortDown(port) => tracing::warn!(
                device = device.name(),
                port,
                "RDMA port down: memory nodes are unreachable until it is active again"
            ),
            EventEffect::PortUp(port) => {
                tracing::info!(device = device.name(), port, "RDMA port active")
            }
            EventEffect::Informational => {
                tracing::debug!(device = device.name(), event_type, "RDMA async event")
            }
        }
        health.record(effect);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_classified_and_unknown_codes_are_harmless() {
        assert_eq!(classify(8, 0), EventEffect::DeviceFatal);
        assert_eq!(classify(10, 1), EventEffect::PortDown(1));
        assert_eq!(classify(9, 1), EventEffect::PortUp(1));
        assert_eq!(classify(1, 0), EventEffect::Informational);
        assert_eq!(classify(4242, 7), EventEffect::Informational);
        assert_eq!(classify(10, -1), EventEffect::PortDown(0));
    }

    #[test]
    fn health_changes_bump_the_generation_once() {
        let health = DeviceHealth::new(1);
        assert!(health.is_usable());
        let g = health.generation();
        assert!(health.record(EventEffect::PortDown(1)));
        assert!(!health.record(EventEffect::PortDown(1)));
        assert!(!health.record(EventEffect::PortDown(2)), "another port");
        assert!(!health.is_usable());
        assert_eq!(health.generation(), g + 1);
        assert!(health.record(EventEffect::PortUp(1)));
        assert!(health.is_usable());
        assert!(health.record(EventEffect::DeviceFatal));
        assert!(!health.is_usable() && health.is_fatal());
        assert!(!health.record(EventEffect::Informational));
        assert_eq!(health.generation(), g + 3);
    }
}
