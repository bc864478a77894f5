//! Cluster configuration: memory-node addresses, sizes, and the cluster file.
//!
//! Clients name memory nodes with `--rdma HOST:PORT,HOST:PORT,...` (node `i` is the
//! `i`-th address) or with a cluster file written by `swarm init`:
//!
//! ```text
//! # SWARM cluster over RDMA (written by `swarm init`)
//! node = 10.0.0.1:7471
//! node = 10.0.0.2:7471
//! node = 10.0.0.3:7471
//! cluster_id = 0x5eed5eed5eed5eed
//! epoch_unix_ns = 1700000000000000000
//! tick_ns = 1000
//! token_file = swarm.token
//! # Optional: how queue pairs address each other (defaults shown).
//! port = 1
//! gid_index = auto
//! traffic_class = 0
//! service_level = 0
//! ```
//!
//! The file carries what a memory node writes into its header (SWARM keeps the
//! timestamp epoch and tick in the node header, [`swarm_core::header`]) and where the
//! token is; the token itself stays in its own file (mode 0600) so the cluster file
//! can be shared and logged. A relative `token_file` is relative to the cluster file.

use std::path::{Path, PathBuf};

use crate::error::RdmaError;
use crate::verbs::gid::GidChoice;

/// How a queue pair addresses its peer: the device port, the GID, and the GRH's
/// traffic class and service level. Shared by clients and memory nodes; the cluster
/// file may set it for everyone, `--port`/`--gid-index` override it per process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathConfig {
    /// Device port (from 1; `None`: port 1).
    pub port: Option<u8>,
    /// Which GID to use (default: the RoCE v2 GID of the local IP address that
    /// reaches the peer; see [`crate::verbs::gid`]).
    pub gid: GidChoice,
    /// GRH traffic class (RoCE: DSCP and ECN bits; PFC fabrics map lossless
    /// classes to it).
    pub traffic_class: u8,
    /// Service level (RoCE: the VLAN priority).
    pub service_level: u8,
}

impl PathConfig {
    /// The port to use.
    pub fn port(&self) -> u8 {
        self.port.unwrap_or(1)
    }

    /// Checks the values (ports count from 1; SLs are 4 bits).
    pub fn validate(&self) -> Result<(), RdmaError> {
        if self.port == Some(0) {
            return Err(RdmaError::Config("device ports count from 1".into()));
        }
        if self.service_level > 15 {
            return Err(RdmaError::Config(format!(
                "service level {} is invalid: it is 0 to 15",
                self.service_level
            )));
        }
        Ok(())
    }

    /// These settings with the command line's `--port`/`--gid-index` (when given)
    /// taking precedence.
    pub fn overridden_by(self, port: Option<u8>, gid: Option<GidChoice>) -> Self {
        Self {
            port: port.or(self.port),
            gid: gid.unwrap_or(self.gid),
            ..self
        }
    }
}

/// Parses a GID index (`auto` or `0`..`255`).
pub fn parse_gid_choice(text: &str) -> Result<GidChoice, RdmaError> {
    match text.trim() {
        "auto" => Ok(GidChoice::Auto),
        n => n.parse().map(GidChoice::Index).map_err(|_| {
            RdmaError::Config(format!(
                "GID index {text:?} is invalid: expected auto or 0 to 255"
            ))
        }),
    }
}

/// Parses a comma-separated list of memory-node addresses (`HOST:PORT`, IPv6 hosts
/// in brackets). Node `i` of the cluster is the `i`-th address.
pub fn parse_nodes(list: &str) -> Result<Vec<String>, RdmaError> {
    let nodes: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    check_nodes(&nodes)?;
    Ok(nodes)
}

fn check_nodes(nodes: &[String]) -> Result<(), RdmaError> {
    if nodes.is_empty() {
        return Err(RdmaError::Config(
            "no memory node given: pass --rdma HOST:PORT,HOST:PORT,...".into(),
        ));
    }
    if nodes.len() > usize::from(u16::MAX) {
        return Err(RdmaError::Config(format!(
            "{} memory nodes given, at most {} are supported",
            nodes.len(),
            u16::MAX
        )));
    }
    for (i, node) in nodes.iter().enumerate() {
        check_address(node)?;
        if nodes[..i].contains(node) {
            return Err(RdmaError::Config(format!(
                "memory node {node} is listed twice"
            )));
        }
    }
    Ok(())
}

/// Checks the shape of one `HOST:PORT` address (resolution happens on connect).
pub fn check_address(addr: &str) -> Result<(), RdmaError> {
    check_host_port(addr, false)
}

/// Checks an address to listen on: like [`check_address`], but port 0 (any free
/// port) is allowed.
pub fn check_listen_address(addr: &str) -> Result<(), RdmaError> {
    check_host_port(addr, true)
}

fn check_host_port(addr: &str, any_port: bool) -> Result<(), RdmaError> {
    let bad = |why: &str| {
        RdmaError::Config(format!(
            "memory node address {addr:?} is invalid ({why}): expected HOST:PORT, e.g. 10.0.0.1:7471 or [fe80::1]:7471"
        ))
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    if host.is_empty() {
        return Err(bad("no host"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(bad("IPv6 addresses need brackets"));
    }
    match port.parse::<u16>() {
        Ok(0) if !any_port => Err(bad("the port must be 1..=65535")),
        Ok(_) => Ok(()),
        Err(_) => Err(bad("the port must be 1..=65535")),
    }
}

/// Parses a memory size such as `4GiB` or `512MiB` ([`swarm_core::units::parse_size`]).
pub fn parse_size(text: &str) -> Result<u64, RdmaError> {
    swarm_core::units::parse_size(text)
        .map_err(|e| RdmaError::Config(format!("size {text:?} is invalid: {e}")))
}

/// The contents of a cluster file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Memory-node addresses; node `i` is `nodes[i]`.
    pub nodes: Vec<String>,
    /// Random id shared by all nodes of the cluster.
    pub cluster_id: u64,
    /// Unix time (ns) of timestamp tick 0.
    pub epoch_unix_ns: u64,
    /// Length of a timestamp tick in ns.
    pub tick_ns: u64,
    /// The token file (absolute, or resolved against the cluster file's directory
    /// by [`ClusterConfig::load`]).
    pub token_file: PathBuf,
    /// Port, GID and traffic class for every process of the cluster.
    pub path: PathConfig,
}

impl ClusterConfig {
    /// Parses the text of a cluster file; `base` resolves a relative token file.
    pub fn parse(text: &str, base: &Path) -> Result<Self, RdmaError> {
        let mut nodes = Vec::new();
        let (mut cluster_id, mut epoch, mut tick, mut token_file) = (None, None, None, None);
        let mut path = PathConfig::default();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |why: &str| {
                RdmaError::Config(format!("cluster file line {}: {why}: {raw:?}", n + 1))
            };
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| bad("expected `key = value`"))?;
            let value = value.trim();
            let number = || parse_u64(value).ok_or_else(|| bad("not a number"));
            let byte =
                || number().and_then(|n| u8::try_from(n).map_err(|_| bad("must be 0 to 255")));
            match key.trim() {
                "node" => nodes.push(value.to_owned()),
                "cluster_id" => cluster_id = Some(number()?),
                "epoch_unix_ns" => epoch = Some(number()?),
                "tick_ns" => tick = Some(number()?),
                "token_file" => token_file = Some(PathBuf::from(value)),
                "port" => path.port = Some(byte()?),
                "gid_index" => {
                    path.gid =
                        parse_gid_choice(value).map_err(|_| bad("expected auto or 0 to 255"))?
                }
                "traffic_class" => path.traffic_class = byte()?,
                "service_level" => path.service_level = byte()?,
                other => return Err(bad(&format!("unknown key {other:?}"))),
            }
        }
        check_nodes(&nodes)?;
        let missing = |key: &str| RdmaError::Config(format!("cluster file has no `{key}`"));
        let tick_ns = tick.ok_or_else(|| missing("tick_ns"))?;
        if tick_ns == 0 {
            return Err(RdmaError::Config("cluster file: tick_ns is zero".into()));
        }
        let token_file = token_file.ok_or_else(|| missing("token_file"))?;
        path.validate()
            .map_err(|e| RdmaError::Config(format!("cluster file: {e}")))?;
        Ok(Self {
            path,
            nodes,
            cluster_id: cluster_id.ok_or_else(|| missing("cluster_id"))?,
            epoch_unix_ns: epoch.ok_or_else(|| missing("epoch_unix_ns"))?,
            tick_ns,
            token_file: if token_file.is_absolute() {
                token_file
            } else {
                base.join(token_file)
            },
        })
    }

    /// Reads and parses a cluster file.
    pub fn load(path: &Path) -> Result<Self, RdmaError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            RdmaError::io(format!("cannot read cluster file {}", path.display()), e)
        })?;
        Self::parse(&text, path.parent().unwrap_or(Path::new(".")))
    }

    /// The file text (what `swarm init` writes).
    pub fn render(&self) -> String {
        let mut out = String::from("# SWARM cluster over RDMA (written by `swarm init`)\n");
        for node in &self.nodes {
            out.push_str(&format!("node = {node}\n"));
        }
        out.push_str(&format!("cluster_id = {:#x}\n", self.cluster_id));
        out.push_str(&format!("epoch_unix_ns = {}\n", self.epoch_unix_ns));
        out.push_str(&format!("tick_ns = {}\n", self.tick_ns));
        out.push_str(&format!("token_file = {}\n", self.token_file.display()));
        let path = self.path;
        if let Some(port) = path.port {
            out.push_str(&format!("port = {port}\n"));
        }
        if let GidChoice::Index(index) = path.gid {
            out.push_str(&format!("gid_index = {index}\n"));
        }
        if path.traffic_class != 0 {
            out.push_str(&format!("traffic_class = {}\n", path.traffic_class));
        }
        if path.service_level != 0 {
            out.push_str(&format!("service_level = {}\n", path.service_level));
        }
        out
    }

    /// The node id of the memory node listening on `listen`: its position in the
    /// node list.
    pub fn node_id(&self, listen: &str) -> Result<u16, RdmaError> {
        self.nodes
            .iter()
            .position(|n| n == listen)
            // At most u16::MAX nodes (checked on parse).
            .map(|i| i as u16)
            .ok_or_else(|| {
                RdmaError::Config(format!(
                    "{listen} is not one of the cluster's memory nodes ({}): listen on the address written in the cluster file",
                    self.nodes.join(", ")
                ))
            })
    }
}

fn parse_u64(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists() {
        assert_eq!(
            parse_nodes("a:1, b:2,[::1]:3,").unwrap(),
            vec!["a:1", "b:2", "[::1]:3"]
        );
        assert!(check_listen_address("0.0.0.0:0").is_ok());
        assert!(check_address("0.0.0.0:0").is_err());
        for bad in ["", "a", "a:0", "a:70000", ":1", "::1:3", "a:1,a:1", "a:x"] {
            assert!(parse_nodes(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size(" 512 MiB ").unwrap(), 512 << 20);
        assert_eq!(parse_size("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["", "GiB", "4 gib", "-1G", "99999999999TiB", "1.5G"] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn cluster_file_roundtrip_and_node_ids() {
        let config = ClusterConfig {
            nodes: vec!["10.0.0.1:7471".into(), "10.0.0.2:7471".into()],
            cluster_id: 0x5eed,
            epoch_unix_ns: 1_700_000_000_000_000_000,
            tick_ns: 1000,
            token_file: PathBuf::from("/etc/swarm/swarm.token"),
            path: PathConfig::default(),
        };
        let parsed = ClusterConfig::parse(&config.render(), Path::new("/x")).unwrap();
        assert_eq!(parsed, config);
        let routed = ClusterConfig {
            path: PathConfig {
                port: Some(2),
                gid: GidChoice::Index(3),
                traffic_class: 106,
                service_level: 3,
            },
            ..config.clone()
        };
        assert_eq!(
            ClusterConfig::parse(&routed.render(), Path::new("/x")).unwrap(),
            routed
        );
        let auto = format!("{}gid_index = auto\n", config.render());
        assert_eq!(
            ClusterConfig::parse(&auto, Path::new("/x")).unwrap(),
            config
        );
        let overridden = routed.path.overridden_by(Some(1), None);
        assert_eq!(
            (overridden.port(), overridden.gid),
            (1, GidChoice::Index(3))
        );
        let overridden = config.path.overridden_by(None, Some(GidChoice::Index(0)));
        assert_eq!(
            (overridden.port(), overridden.gid),
            (1, GidChoice::Index(0))
        );
        assert_eq!(parsed.node_id("10.0.0.2:7471").unwrap(), 1);
        assert!(parsed.node_id("0.0.0.0:7471").is_err());
        let relative = config.render().replace("/etc/swarm/", "");
        let parsed = ClusterConfig::parse(&relative, Path::new("/conf")).unwrap();
        assert_eq!(parsed.token_file, PathBuf::from("/conf/swarm.token"));
    }

    #[test]
    fn bad_cluster_files_name_the_problem() {
        let cases = [
            (
                "node = a:1\ncluster_id = 1\nepoch_unix_ns = 0\ntick_ns = 1\n",
                "token_file",
            ),
            ("node = a:1\nbogus = 3\n", "unknown key"),
            ("node a:1\n", "key = value"),
            ("cluster_id = 1\n", "no memory node"),
            ("node = a:1\ncluster_id = zz\n", "not a number"),
            (
                "node = a:1\ncluster_id = 1\nepoch_unix_ns = 0\ntick_ns = 0\ntoken_file = t\n",
                "tick_ns is zero",
            ),
            ("node = a:1\ngid_index = 256\n", "auto or 0 to 255"),
            (
                "node = a:1\nport = 0\ncluster_id = 1\nepoch_unix_ns = 0\ntick_ns = 1\ntoken_file = t\n",
                "count from 1",
            ),
            (
                "node = a:1\nservice_level = 16\ncluster_id = 1\nepoch_unix_ns = 0\ntick_ns = 1\ntoken_file = t\n",
                "0 to 15",
            ),
        ];
        for (text, expected) in cases {
            let error = ClusterConfig::parse(text, Path::new("."))
                .unwrap_err()
                .to_string();
            assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        }
    }
}
