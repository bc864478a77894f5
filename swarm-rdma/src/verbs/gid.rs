//! Addressing on a port: link layer, the GID table, and which GID to use.
//!
//! On InfiniBand a queue pair is addressed by LID; a global route header (GRH, with
//! GIDs) is only needed to leave the subnet. On Ethernet (RoCE) every packet carries a
//! GRH, and the GID table holds one entry per IP address *and* RoCE version of the
//! port's network interfaces: on mlx5, index 0 is typically the RoCE v1 entry of the
//! link-local IPv6 address, which a routed or RoCE v2-only fabric drops, so a fixed
//! index 0 connects fine over TCP and then fails every request with
//! `RETRY_EXC_ERR`. The GID to use is the RoCE v2 entry of the IP address the
//! bootstrap traffic leaves from: that is what [`select`] picks by default, with an
//! explicit `--gid-index` to override it.
//!
//! libibverbs reports GID types through `ibv_query_gid_ex`, which the `rdma-sys`
//! bindings lack; the kernel exports the same in sysfs
//! (`/sys/class/infiniband/DEV/ports/PORT/gid_attrs/types/INDEX`), read here.

use std::net::{IpAddr, Ipv6Addr};

/// The link layer of a port (`ibv_port_attr::link_layer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: LID routing, GRH only across subnets.
    Infiniband,
    /// Ethernet (RoCE): every packet needs a GRH and a valid GID.
    Ethernet,
}

impl LinkLayer {
    /// From `ibv_port_attr::link_layer` (`IBV_LINK_LAYER_*`); unspecified (0) is
    /// InfiniBand, as libibverbs documents for old kernels.
    pub fn from_verbs(code: u8) -> Self {
        const IBV_LINK_LAYER_ETHERNET: u8 = 2;
        if code == IBV_LINK_LAYER_ETHERNET {
            Self::Ethernet
        } else {
            Self::Infiniband
        }
    }
}

/// A GID table entry's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand, or RoCE v1 (Ethernet frames with a GRH, not routable over IP).
    IbOrRoceV1,
    /// RoCE v2: UDP/IP packets, routable.
    RoceV2,
    /// The kernel did not say (old kernels; InfiniBand ports).
    Unknown,
}

impl GidType {
    /// From the text of sysfs `gid_attrs/types/INDEX`.
    pub fn from_sysfs(text: &str) -> Self {
        match text.trim() {
            "RoCE v2" => Self::RoceV2,
            "IB/RoCE v1" | "RoCE v1" | "IB" => Self::IbOrRoceV1,
            _ => Self::Unknown,
        }
    }
}

/// One populated entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the table (`sgid_index`).
    pub index: u8,
    /// The GID.
    pub gid: [u8; 16],
    /// Its type.
    pub kind: GidType,
}

/// Which GID a queue pair uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GidChoice {
    /// The RoCE v2 entry of the local IP address that reaches the peer (Ethernet),
    /// index 0 (InfiniBand).
    #[default]
    Auto,
    /// This index of the table.
    Index(u8),
}

/// The GID of an IP address as RoCE writes it: IPv4 addresses are IPv4-mapped IPv6.
pub fn ip_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Picks the GID for traffic leaving from `local_ip` (when known) on a port with
/// `link` and the populated `table`. Errors say what to pass instead.
pub fn select(
    table: &[GidEntry],
    link: LinkLayer,
    choice: GidChoice,
    local_ip: Option<IpAddr>,
) -> Result<GidEntry, String> {
    let usable = |e: &&GidEntry| e.gid != [0; 16];
    let entry = match choice {
        GidChoice::Index(index) => {
            let Some(entry) = table.iter().find(|e| e.index == index) else {
                return Err(format!(
                    "GID index {index} is not populated on this port ({})",
                    describe(table)
                ));
            };
            *entry
        }
        GidChoice::Auto if link == LinkLayer::Infiniband => {
            // LID routing; GID 0 is the port GUID-based address.
            table
                .iter()
                .find(|e| e.index == 0)
                .copied()
                .unwrap_or(GidEntry {
                    index: 0,
                    gid: [0; 16],
                    kind: GidType::Unknown,
                })
        }
        GidChoice::Auto => {
            // A loopback address is in no GID table: the peer is on this host, and
            // any GID of the device reaches it.
            let local_ip = local_ip.filter(|ip| !ip.is_loopback());
            let v2 = |e: &&GidEntry| e.kind == GidType::RoceV2;
            let wanted = local_ip.map(ip_gid);
            let of_ip = |e: &&GidEntry| Some(e.gid) == wanted;
            let ipv4 = |e: &&GidEntry| Ipv6Addr::from(e.gid).to_ipv4_mapped().is_some();
            let found = table
                .iter()
                .find(|e| v2(e) && of_ip(e))
                .or_else(|| table.iter().find(of_ip))
                .or_else(|| match local_ip {
                    // The local address has no GID: the device is not on that
                    // interface. Any other choice would be a guess.
                    Some(_) => None,
                    None => table
                        .iter()
                        .find(|e| v2(e) && ipv4(e))
                        .or_else(|| table.iter().filter(usable).find(v2)),
                });
            let Some(found) = found else {
                return Err(match local_ip {
                    Some(ip) => format!(
                        "no GID of this port belongs to {ip}, the local address that reaches \
                         the memory node: use the RDMA device of that interface (--device) or \
                         pass --gid-index ({})",
                        describe(table)
                    ),
                    None => format!(
                        "no RoCE v2 GID on this port: pass --gid-index ({})",
                        describe(table)
                    ),
                });
            };
            *found
        }
    };
    if link == LinkLayer::Ethernet && entry.gid == [0; 16] {
        return Err(format!(
            "GID index {} is all zero, which RoCE cannot address: the interface has no IP \
             address for it; pick another with --gid-index ({})",
            entry.index,
            describe(table)
        ));
    }
    Ok(entry)
}

/// Whether packets to `remote` need a global route header: always on Ethernet, and
/// on InfiniBand only when the peer is in another subnet (its subnet prefix, the
/// GID's first 8 bytes, differs) — a GRH there is legal but costs 40 bytes a packet.
pub fn needs_grh(link: LinkLayer, local: &[u8; 16], remote: &[u8; 16]) -> bool {
    match link {
        LinkLayer::Ethernet => true,
        LinkLayer::Infiniband => *remote != [0; 16] && remote[..8] != local[..8],
    }
}

/// The table, for error messages: `index: address (type)`, populated entries only.
fn describe(table: &[GidEntry]) -> String {
    let entries: Vec<String> = table
        .iter()
        .filter(|e| e.gid != [0; 16])
        .map(|e| {
            let addr = Ipv6Addr::from(e.gid);
            let addr = match addr.to_ipv4_mapped() {
                Some(v4) => v4.to_string(),
                None => addr.to_string(),
            };
            let kind = match e.kind {
                GidType::RoceV2 => "RoCE v2",
                GidType::IbOrRoceV1 => "IB/RoCE v1",
                GidType::Unknown => "type unknown",
            };
            format!("{}: {addr} ({kind})", e.index)
        })
        .collect();
    if entries.is_empty() {
        "the GID table is empty".into()
    } else {
        format!("GID table: {}; see also `show_gids`", entries.join(", "))
    }
}

/// The type of GID `index` of `port` of device `device`, from sysfs.
pub fn sysfs_type(device: &str, port: u8, index: u8) -> GidType {
    let path = format!("/sys/class/infiniband/{device}/ports/{port}/gid_attrs/types/{index}");
    std::fs::read_to_string(path)
        .map(|t| GidType::from_sysfs(&t))
        .unwrap_or(GidType::Unknown)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn entry(index: u8, ip: &str, kind: GidType) -> GidEntry {
        GidEntry {
            index,
            gid: ip_gid(ip.parse().unwrap()),
            kind,
        }
    }

    /// What soft-RoCE and mlx5 show for a port with one IPv4 address.
    fn roce_table() -> Vec<GidEntry> {
        vec![
            entry(0, "fe80::5054:ff:fe12:3456", GidType::IbOrRoceV1),
            entry(1, "fe80::5054:ff:fe12:3456", GidType::RoceV2),
            entry(2, "10.0.2.15", GidType::IbOrRoceV1),
            entry(3, "10.0.2.15", GidType::RoceV2),
        ]
    }

    #[test]
    fn roce_picks_the_v2_entry_of_the_local_address_not_index_0() {
        let local = Some(IpAddr::V4(Ipv4Addr::new(10, 0, 2, 15)));
        let e = select(&roce_table(), LinkLayer::Ethernet, GidChoice::Auto, local).unwrap();
        assert_eq!(e.index, 3);
        // Without a known local address: a v2 IPv4 entry still beats index 0.
        let e = select(&roce_table(), LinkLayer::Ethernet, GidChoice::Auto, None).unwrap();
        assert_eq!(e.index, 3);
        // A peer on this host, reached over loopback: any v2 entry works.
        let loopback = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let e = select(
            &roce_table(),
            LinkLayer::Ethernet,
            GidChoice::Auto,
            loopback,
        )
        .unwrap();
        assert_eq!(e.index, 3);
        // An address of another interface: refused with the table, not guessed.
        let other = Some(IpAddr::V4(Ipv4Addr::new(192, 168, 1, 2)));
        let error = select(&roce_table(), LinkLayer::Ethernet, GidChoice::Auto, other).unwrap_err();
        assert!(
            error.contains("192.168.1.2") && error.contains("3: 10.0.2.15 (RoCE v2)"),
            "{error}"
        );
        // Old kernels without types: the entry of the address still wins.
        let untyped: Vec<_> = roce_table()
            .into_iter()
            .map(|e| GidEntry {
                kind: GidType::Unknown,
                ..e
            })
            .collect();
        let e = select(&untyped, LinkLayer::Ethernet, GidChoice::Auto, local).unwrap();
        assert_eq!(e.index, 2);
    }

    #[test]
    fn explicit_indexes_are_checked() {
        let e = select(
            &roce_table(),
            LinkLayer::Ethernet,
            GidChoice::Index(1),
            None,
        )
        .unwrap();
        assert_eq!(e.index, 1);
        let error = select(
            &roce_table(),
            LinkLayer::Ethernet,
            GidChoice::Index(9),
            None,
        )
        .unwrap_err();
        assert!(error.contains("not populated"), "{error}");
        let mut table = roce_table();
        table[0].gid = [0; 16];
        let error = select(&table, LinkLayer::Ethernet, GidChoice::Index(0), None).unwrap_err();
        assert!(error.contains("all zero"), "{error}");
    }

    #[test]
    fn infiniband_uses_index_0_and_a_grh_only_across_subnets() {
        let mut gid0 = [0u8; 16];
        gid0[..2].copy_from_slice(&[0xfe, 0x80]);
        gid0[15] = 1;
        let table = [GidEntry {
            index: 0,
            gid: gid0,
            kind: GidType::IbOrRoceV1,
        }];
        let e = select(&table, LinkLayer::Infiniband, GidChoice::Auto, None).unwrap();
        assert_eq!(e.index, 0);
        let mut same_subnet = gid0;
        same_subnet[15] = 2;
        assert!(!needs_grh(LinkLayer::Infiniband, &gid0, &same_subnet));
        assert!(!needs_grh(LinkLayer::Infiniband, &gid0, &[0; 16]));
        let mut other_subnet = same_subnet;
        other_subnet[7] = 9;
        assert!(needs_grh(LinkLayer::Infiniband, &gid0, &other_subnet));
        assert!(needs_grh(LinkLayer::Ethernet, &gid0, &same_subnet));
    }

    #[test]
    fn sysfs_types_and_link_layers_decode() {
        assert_eq!(GidType::from_sysfs("RoCE v2\n"), GidType::RoceV2);
        assert_eq!(GidType::from_sysfs("IB/RoCE v1\n"), GidType::IbOrRoceV1);
        assert_eq!(GidType::from_sysfs(""), GidType::Unknown);
        assert_eq!(LinkLayer::from_verbs(2), LinkLayer::Ethernet);
        assert_eq!(LinkLayer::from_verbs(1), LinkLayer::Infiniband);
        assert_eq!(LinkLayer::from_verbs(0), LinkLayer::Infiniband);
        assert_eq!(
            ip_gid("10.0.2.15".parse().unwrap())[10..],
            [0xff, 0xff, 10, 0, 2, 15]
        );
    }
}
