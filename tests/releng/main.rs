//! Release engineering: `release create`, charts, plans, promotion and rollback in Git, validation,
//! and upstream operators' published manifests.
//!
//! One test binary for the area (`cargo test --test releng [FILTER]`); each module was a
//! binary of its own, and shares the support modules below.

#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../agent_support/mod.rs"]
mod agent_support;
#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../fleet_support/mod.rs"]
mod fleet_support;
#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../releng_common/mod.rs"]
mod releng_common;
#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../status_support/mod.rs"]
mod status_support;

mod real_operator;
mod releng_chart;
mod releng_create;
mod releng_forge_pr;
mod releng_plan;
mod releng_promote_rollback;
mod upstream_operators;
mod validate;
