//! The agent's persisted state: [`machine`] is the pure state machine ([`AgentState`], its
//! [`Progress`] and transitions), [`store`] keeps it in the ConfigMap `fleetgate-state-<cluster>`
//! of the state namespace with optimistic concurrency, so a restart (even `kill -9` mid-apply)
//! resumes where the last agent stopped. [`outbox`] keeps the statuses Git could not take yet.

pub mod machine;
pub mod outbox;
pub mod store;

pub use machine::{
    AgentState, Failure, NEEDS_SIGNED_DECISION, Next, Operation, Phase, Progress, Rejection, Return, Rollback,
    Severity, Transition, TransitionError, TrustMemory, WriteBack,
};
pub use outbox::{Outbox, Refused};
pub use store::{
    CLUSTER_LABEL, PAUSED_ANNOTATION, Peeked, RECONCILE_HANDLED_ANNOTATION, RECONCILE_REQUEST_ANNOTATION, StateError,
    StateStore, state_configmap_name,
};
