//! The apply engine against a real API server: server-side apply, pruning, rollouts, snapshots,
//! refusals and drift.
//!
//! One test binary for the area (`cargo test --test apply [FILTER]`); each module was a
//! binary of its own, and shares the support modules below.

#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../apply_support/mod.rs"]
mod apply_support;

mod apply;
mod apply_prune;
mod apply_refusals;
mod apply_rollout;
mod apply_snapshot;
mod apply_unchanged;
mod drift;
