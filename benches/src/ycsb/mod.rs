//! The YCSB benchmark harness of SWARM-KV (`swarm bench`), reproducing the paper's
//! evaluation setting (SWARM §7).
//!
//! The paper measures SWARM-KV with YCSB workloads A (50 % gets, 50 % updates) and B
//! (95 % / 5 %) over a scrambled Zipfian (0.99) key choice, 100 000 keys of 24 B,
//! 64 B values, 3 replicas and 4 clients with one operation at a time, against
//! baselines run on the same fabric: RAW (unreplicated, the latency floor) and DM-ABD
//! (two roundtrips per operation). Its headline numbers are latency percentiles per
//! operation and, in Table 2, the number of **roundtrips** per operation, which is
//! transport independent: on shared memory without emulated latency, latencies say
//! little about RDMA, but roundtrip counts say exactly the same thing.
//!
//! The pieces, each in its own file:
//! * [`zipf`]: YCSB's scrambled Zipfian key law (`ScrambledZipfianGenerator`'s
//!   constants and scramble), drawn from an alias table;
//! * [`workload`]: the operation mix, YCSB key names, and values that are unique per
//!   write (so recorded histories can be checked for linearizability);
//! * [`stats`]: per-thread HDR latency histograms and roundtrip counts per operation
//!   kind, merged at the end;
//! * [`report`]: [`BenchReport`], its JSON schema (documented there) and its table;
//! * [`compare`]: the side-by-side table of several systems;
//! * [`plot`]: the paper's figures as PNG files (`--plot DIR`);
//! * [`config`]: [`BenchConfig`] and the `swarm bench` flags ([`BenchArgs`]);
//! * [`sizing`]: how large a cluster a run needs;
//! * `run`: [`run`], the driver: client threads, phases, operations in flight, node
//!   crash, history (`history`) and phase gates (`gate`);
//! * `temp`: [`TempStore`], a throw-away cluster for benchmarks and tests;
//! * [`timeline`]: throughput and latency per interval of the measured phase (Figure 11);
//! * `bench_client`: what the driver needs from a system's client, implemented by
//!   SWARM-KV's and FUSEE's;
//! * `fusee`: the FUSEE baseline's throw-away store ([`run_fusee`]).

mod bench_client;
pub mod compare;
pub mod config;
mod error;
mod fusee;
mod gate;
mod history;
pub mod plot;
pub mod report;
mod run;
pub mod sizing;
pub mod stats;
mod temp;
pub mod timeline;
pub mod workload;
pub mod zipf;

pub use bench_client::OpError;
pub use compare::comparison_table;
pub use config::{BenchArgs, BenchConfig, FailPlan, System};
pub use error::BenchError;
pub use report::BenchReport;
pub use run::{register_protocol, run, run_fusee, run_on};
pub use temp::TempStore;
pub use workload::{OpType, Workload};
