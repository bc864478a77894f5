//! Linearizability checker over JSON Lines histories (work in progress).
