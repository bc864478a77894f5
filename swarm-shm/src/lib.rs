//! SWARM fabric over memory-mapped shared files (placeholder until the transport lands).
