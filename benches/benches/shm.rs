//! Shared-memory transport micro-benchmarks (work in progress).
fn main() {}
