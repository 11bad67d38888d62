//! The agent's persisted state: [`machine`] is the pure state machine ([`AgentState`], its
//! [`Progress`] and transitions), [`store`] keeps it in the ConfigMap `fleetgate-state-<cluster>`
//! of the state namespace with optimistic concurrency, so a restart (even `kill -9` mid-apply)
//! resumes where the last agent stopped.

pub mod machine;
pub mod store;

pub use machine::*;
pub use store::{CLUSTER_LABEL, StateError, StateStore};
