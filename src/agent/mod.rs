//! The agent: the reconcile loop of one spoke cluster, its persisted state machine, automatic rollback, triggers and HTTP endpoints.
