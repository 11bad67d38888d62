//! The agent's loop against real components: a real API server (and controllers where workloads
//! roll out), the fleet repo on a real `git daemon`, real GnuPG and SSH keys, agents running as
//! their ServiceAccount with the RBAC deploy/ ships.
//!
//! One test binary for the area (`cargo test --test agent [FILTER]`); each module was a
//! binary of its own, and shares the support modules below.

#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../agent_support/mod.rs"]
mod agent_support;
#[path = "../notify_support/mod.rs"]
mod notify_support;

mod agent_approvals;
mod agent_as_deployed;
mod agent_blocked_by_crd_incompat;
mod agent_corrects_drift;
mod agent_fetch_limits;
mod agent_infra_cli;
mod agent_infra_events;
mod agent_infra_http;
mod agent_infra_lease;
mod agent_infra_notify;
mod agent_infra_state;
mod agent_infra_triggers;
mod agent_kill_matrix;
mod agent_log_spans;
mod agent_pause;
mod agent_prometheus_rollback;
mod agent_publishes_status;
mod agent_refuses_bad_signature;
mod agent_restores_crs;
mod agent_resumes_after_restart;
mod agent_rollback_keeps_crd;
mod agent_rollback_target;
mod agent_rollback_without_git;
mod agent_sends_notification;
mod agent_spoke_plans;
mod agent_status_key;
mod agent_two_replicas;
mod agent_variants;
mod agent_waves;
mod agent_write_back;
mod agent_write_back_signed;
mod agent_write_back_through_loop;
