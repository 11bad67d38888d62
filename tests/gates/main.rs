//! Quality gates against real components: Prometheus, workloads, custom resources, CRD compatibility.
//!
//! One test binary for the area (`cargo test --test gates [FILTER]`); each module was a
//! binary of its own, and shares the support modules below.

#[path = "../gates_support/mod.rs"]
mod gates_support;
#[allow(dead_code, unused_imports)] // shared by several areas; each uses a part
#[path = "../tls_support/mod.rs"]
mod tls_support;

mod gates_crd_compat;
mod gates_crd_differential;
mod gates_custom_resources;
mod gates_preapply;
mod gates_prometheus;
mod gates_prometheus_auth;
mod gates_workload;
