//! SWARM-KV (placeholder until its issue lands).
