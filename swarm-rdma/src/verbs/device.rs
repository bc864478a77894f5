//! Opening an RDMA device: context, protection domain, capabilities, port.
//!
//! This is where a machine without RDMA shows: `ibv_get_device_list` returns nothing
//! (no device) or fails (`ENOSYS`: no kernel support at all), and we turn both into
//! [`RdmaError::NoDevice`] — a clear message and an error status, never a panic.

use std::ffi::CStr;
use std::io;
use std::net::IpAddr;
use std::ptr::NonNull;

use rdma_sys::{
    ___ibv_query_port, ibv_alloc_pd, ibv_close_device, ibv_context, ibv_dealloc_pd,
    ibv_device_attr, ibv_free_device_list, ibv_get_device_list, ibv_get_device_name, ibv_gid,
    ibv_open_device, ibv_pd, ibv_port_attr, ibv_port_state, ibv_query_device, ibv_query_gid,
};

use crate::error::RdmaError;
use crate::verbs::gid::{self, GidChoice, GidEntry, LinkLayer};

/// The capabilities of a device that the transport uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Completion-queue entries.
    pub max_cqe: u32,
    /// Outstanding READs/atomics a queue pair accepts as a responder.
    pub max_qp_rd_atom: u8,
    /// Outstanding READs/atomics a queue pair issues as a requester.
    pub max_qp_init_rd_atom: u8,
    /// Whether 8-byte atomics are supported at all (`atomic_cap != IBV_ATOMIC_NONE`).
    pub atomics: bool,
    /// Largest memory region.
    pub max_mr_size: u64,
}

/// One port of a device and the GID a queue pair uses on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub port: u8,
    /// InfiniBand or Ethernet (RoCE).
    pub link_layer: LinkLayer,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The GID in use.
    pub gid: [u8; 16],
    /// Its index in the GID table (`sgid_index` of the GRH).
    pub gid_index: u8,
    /// Active MTU as an `ibv_mtu` code.
    pub active_mtu: u8,
    /// Largest message.
    pub max_msg_sz: u32,
}

/// An active port: its attributes and GID table, from which each connection picks
/// its GID ([`PortAttr::address`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// The device's name, for messages.
    pub device: String,
    /// Port number (from 1).
    pub port: u8,
    /// InfiniBand or Ethernet (RoCE).
    pub link_layer: LinkLayer,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Active MTU as an `ibv_mtu` code.
    pub active_mtu: u8,
    /// Largest message.
    pub max_msg_sz: u32,
    /// Populated GID table entries.
    pub gids: Vec<GidEntry>,
}

impl PortAttr {
    /// The port with the GID `choice` gives for traffic leaving from `local_ip`
    /// ([`gid::select`]).
    pub fn address(
        &self,
        choice: GidChoice,
        local_ip: Option<IpAddr>,
    ) -> Result<PortInfo, RdmaError> {
        let entry =
            gid::select(&self.gids, self.link_layer, choice, local_ip).map_err(|detail| {
                RdmaError::Addressing {
                    device: self.device.clone(),
                    port: self.port,
                    detail,
                }
            })?;
        tracing::debug!(
            device = %self.device,
            port = self.port,
            gid_index = entry.index,
            gid = %std::net::Ipv6Addr::from(entry.gid),
            kind = ?entry.kind,
            ?local_ip,
            "GID selected"
        );
        Ok(PortInfo {
            port: self.port,
            link_layer: self.link_layer,
            lid: self.lid,
            gid: entry.gid,
            gid_index: entry.index,
            active_mtu: self.active_mtu,
            max_msg_sz: self.max_msg_sz,
        })
    }
}

/// An open device with one protection domain. Verbs objects are thread-safe, so one
/// `Device` is shared (in an `Arc`) by every client thread of a process.
#[derive(Debug)]
pub struct Device {
    name: String,
    context: NonNull<ibv_context>,
    pd: NonNull<ibv_pd>,
    caps: DeviceCaps,
}

// SAFETY: libibverbs documents every verb as thread-safe; the context and PD pointers
// are only used through verbs and live until `Drop`, which needs `&mut self`.
unsafe impl Send for Device {}
// SAFETY: as above: shared references only call thread-safe verbs.
unsafe impl Sync for Device {}

/// Frees the device list on every exit path.
struct DeviceList {
    list: NonNull<*mut rdma_sys::ibv_device>,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<Self, RdmaError> {
        let mut len = 0;
        // SAFETY: `len` is a valid out-pointer; the returned list is freed in Drop.
        let list = unsafe { ibv_get_device_list(&mut len) };
        let Some(list) = NonNull::new(list) else {
            let error = io::Error::last_os_error();
            return Err(RdmaError::NoDevice {
                detail: format!("ibv_get_device_list failed: {error}"),
            });
        };
        Ok(Self {
            list,
            len: usize::try_from(len).unwrap_or(0),
        })
    }

    fn device(&self, i: usize) -> *mut rdma_sys::ibv_device {
        debug_assert!(i < self.len);
        // SAFETY: the list holds `len` valid device pointers (checked above).
        unsafe { *self.list.as_ptr().add(i) }
    }

    fn name(&self, i: usize) -> String {
        // SAFETY: `device(i)` is a valid device; its name is a NUL-terminated string
        // owned by the list, copied before the list is freed.
        let name = unsafe { ibv_get_device_name(self.device(i)) };
        if name.is_null() {
            return format!("device{i}");
        }
        // SAFETY: non-null, NUL-terminated, alive while the list is.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    fn names(&self) -> Vec<String> {
        (0..self.len).map(|i| self.name(i)).collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { ibv_free_device_list(self.list.as_ptr()) };
    }
}

/// Names of the RDMA devices present. Fails with [`RdmaError::NoDevice`] when there
/// is none, or no RDMA support at all.
pub fn device_names() -> Result<Vec<String>, RdmaError> {
    let list = DeviceList::get()?;
    if list.len == 0 {
        return Err(no_device_listed());
    }
    Ok(list.names())
}

fn no_device_listed() -> RdmaError {
    RdmaError::NoDevice {
        detail: "ibv_get_device_list returned none".into(),
    }
}

/// Opens the device called `name`, or the first device when `name` is `None`, and
/// allocates its protection domain.
pub fn open_device(name: Option<&str>) -> Result<Device, RdmaError> {
    let list = DeviceList::get()?;
    if list.len == 0 {
        return Err(no_device_listed());
    }
    let names = list.names();
    let index = match name {
        None => 0,
        Some(wanted) => {
            names
                .iter()
                .position(|n| n == wanted)
                .ok_or_else(|| RdmaError::UnknownDevice {
                    name: wanted.to_owned(),
                    available: names.join(", "),
                })?
        }
    };
    // SAFETY: the device pointer is valid while `list` is alive; the context stays
    // valid after the list is freed (it is closed in Device::drop).
    let context = unsafe { ibv_open_device(list.device(index)) };
    let context = NonNull::new(context).ok_or_else(|| RdmaError::last_os("ibv_open_device"))?;
    drop(list);
    let name = names[index].clone();
    // SAFETY: `context` is an open device context.
    let pd = unsafe { ibv_alloc_pd(context.as_ptr()) };
    let Some(pd) = NonNull::new(pd) else {
        let error = RdmaError::last_os("ibv_alloc_pd");
        // SAFETY: the context is open and owned here; nothing else refers to it.
        unsafe { ibv_close_device(context.as_ptr()) };
        return Err(error);
    };
    let mut device = Device {
        name,
        context,
        pd,
        caps: DeviceCaps {
            max_qp_wr: 0,
            max_cqe: 0,
            max_qp_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            atomics: false,
            max_mr_size: 0,
        },
    };
    device.caps = device.query_caps()?;
    Ok(device)
}

impl Device {
    /// The device name (e.g. `mlx5_0`, `rxe0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's capabilities.
    pub fn caps(&self) -> DeviceCaps {
        self.caps
    }

    pub(crate) fn context(&self) -> *mut ibv_context {
        self.context.as_ptr()
    }

    /// The context's asynchronous event descriptor ([`crate::verbs::events`]).
    pub(crate) fn async_fd(&self) -> i32 {
        // SAFETY: the context is open until drop; async_fd is set at open and
        // never changes.
        unsafe { (*self.context()).async_fd }
    }

    pub(crate) fn pd(&self) -> *mut ibv_pd {
        self.pd.as_ptr()
    }

    fn query_caps(&self) -> Result<DeviceCaps, RdmaError> {
        // SAFETY: ibv_device_attr is plain data (integers and arrays); all-zero is a
        // valid value for ibv_query_device to overwrite.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `attr` is a valid out-pointer.
        let rc = unsafe { ibv_query_device(self.context(), &mut attr) };
        if rc != 0 {
            return Err(RdmaError::code("ibv_query_device", rc));
        }
        let clamp_u8 = |v: i32| u8::try_from(v.max(0)).unwrap_or(u8::MAX);
        Ok(DeviceCaps {
            max_qp_wr: u32::try_from(attr.max_qp_wr).unwrap_or(0),
            max_cqe: u32::try_from(attr.max_cqe).unwrap_or(0),
            max_qp_rd_atom: clamp_u8(attr.max_qp_rd_atom),
            max_qp_init_rd_atom: clamp_u8(attr.max_qp_init_rd_atom),
            atomics: attr.atomic_cap != rdma_sys::ibv_atomic_cap::IBV_ATOMIC_NONE,
            max_mr_size: attr.max_mr_size,
        })
    }

    /// Queries `port` and its GID table; fails if the port is not active.
    pub fn port(&self, port: u8) -> Result<PortAttr, RdmaError> {
        // SAFETY: ibv_port_attr is plain data; zero is valid before the query fills it.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `attr` is a valid, correctly sized out-pointer.
        let rc = unsafe { ___ibv_query_port(self.context(), port, &mut attr) };
        if rc != 0 {
            return Err(RdmaError::code("ibv_query_port", rc));
        }
        if attr.state != ibv_port_state::IBV_PORT_ACTIVE {
            return Err(RdmaError::PortNotActive {
                device: self.name.clone(),
                port,
                state: attr.state,
            });
        }
        // sgid_index is a u8: entries past 255 cannot be used anyway.
        let table_len = u16::try_from(attr.gid_tbl_len).unwrap_or(0).min(256);
        let mut gids = Vec::new();
        for index in 0..table_len {
            // Below 256.
            let index = index as u8;
            // SAFETY: ibv_gid is a 16-byte union of plain data.
            let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
            // SAFETY: the context is open; `gid` is a valid out-pointer.
            let rc = unsafe { ibv_query_gid(self.context(), port, i32::from(index), &mut gid) };
            // SAFETY: every bit pattern of the union is a valid byte array.
            let raw = unsafe { gid.raw };
            if rc != 0 || raw == [0; 16] {
                continue;
            }
            gids.push(GidEntry {
                index,
                gid: raw,
                kind: gid::sysfs_type(&self.name, port, index),
            });
        }
        Ok(PortAttr {
            device: self.name.clone(),
            port,
            link_layer: LinkLayer::from_verbs(attr.link_layer),
            lid: attr.lid,
            active_mtu: u8::try_from(attr.active_mtu).unwrap_or(1),
            max_msg_sz: attr.max_msg_sz,
            gids,
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // Every QP, CQ and MR holds an Arc<Device>, so they are gone by now.
        // SAFETY: the PD and context are owned by this Device and released once.
        unsafe {
            ibv_dealloc_pd(self.pd.as_ptr());
            ibv_close_device(self.context.as_ptr());
        }
    }
}
