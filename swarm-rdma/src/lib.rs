//! SWARM fabric over RDMA verbs (placeholder until its issue lands).
