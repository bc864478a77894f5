//! The deterministic, fault-injecting simulated fabric (work in progress).
