//! Reading the fleet: statuses in Git notes and on a forge, heartbeats, the matrix in the
//! terminal, as HTML and served live.
//!
//! One test binary for the area (`cargo test --test status [FILTER]`); each module was a
//! binary of its own, and shares the support modules below.

#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../agent_support/mod.rs"]
mod agent_support;
#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../releng_common/mod.rs"]
mod releng_common;
#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../status_support/mod.rs"]
mod status_support;

mod get_agents;
mod status_cli;
mod status_forge;
mod status_heartbeat;
mod status_html;
mod status_live;
mod status_notes;
