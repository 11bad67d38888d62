//! Attacks on the trust boundary, each performed for real (pushes without a key, replays, forged
//! statuses, tampered state), and the verification they run into.
//!
//! One test binary for the area (`cargo test --test trust [FILTER]`); each module was a
//! binary of its own, and shares the support modules below.

#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../agent_support/mod.rs"]
mod agent_support;
#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../apply_support/mod.rs"]
mod apply_support;
#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../fleet_support/mod.rs"]
mod fleet_support;
#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../status_support/mod.rs"]
mod status_support;
#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../tls_support/mod.rs"]
mod tls_support;

mod attack_admission_by_content;
mod attack_agent_self_escalation;
mod attack_cel_gate_on_secret;
mod attack_downgrade_to_old_release;
mod attack_force_push_signed_promotions;
mod attack_foreign_fleet_tag;
mod attack_forge_token_exfiltration;
mod attack_forged_status;
mod attack_git_https_redirect;
mod attack_relabeled_cluster_keeps_its_gates;
mod attack_signed_write_back;
mod attack_tampered_agent_state;
mod attack_toggle_rejected_release;
mod attack_wave_moved_on_unsigned_tip;
mod attack_weakened_gate_policy;
mod git_access;
mod source;
mod trust;
mod trust_ssh;
