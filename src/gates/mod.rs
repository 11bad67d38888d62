//! Gates: pre-apply (CRD compatibility, cluster requirements, existing CRs) and post-apply (health, restarts, CEL, Prometheus) evaluations.

pub mod crd_compat;
mod evaluation;

pub use evaluation::*;
