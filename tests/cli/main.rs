//! The CLI, the deploy manifests, the Helm chart, the docs' commands, setup on a machine, the
//! image, the forges, and the module layering.
//!
//! One test binary for the area (`cargo test --test cli [FILTER]`); each module was a
//! binary of its own, and shares the support modules below.

#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../agent_support/mod.rs"]
mod agent_support;
#[path = "../docs_support/mod.rs"]
mod docs_support;
#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../releng_common/mod.rs"]
mod releng_common;
#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../status_support/mod.rs"]
mod status_support;

mod cli_audit;
mod cli_events_tree;
mod cli_habits;
mod deploy;
mod docs_quickstart;
mod forge_gitea;
mod forge_github_app;
mod helm_chart;
mod image;
mod layering;
mod setup;
