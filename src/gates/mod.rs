//! Gates decide whether a release may be applied and whether it may stay.
//!
//! ```text
//!  pre-apply (preapply)                     post-apply (GateRunner, every interval for bakeTime)
//!  ─ cluster requirements (version, archs)  ─ Deployment available        ─ pod restarts ≤ N
//!  ─ CRD compatibility vs live CRDs         ─ custom resources healthy (CEL, min ratio)
//!  ─ live CRs valid under the new schemas   ─ Prometheus: absolute / vs baseline ─ webhook reachable
//! ```
//!
//! The agent calls, in order: [`preapply`] (refuse before touching anything), [`sample_baseline`]
//! (just before the apply: metric baselines and pod restart counts), then [`GateRunner::run`]
//! after the apply, which reports each [`Round`] and ends in a [`BakeVerdict`].
//!
//! Every gate yields a [`GateEvaluation`] — gate, observed figure, threshold, verdict
//! (pass / fail / unknown with reason) — that reads as a sentence (`error-rate 7.3 % > 5 %`) and
//! serializes for statuses. The comparisons are pure functions tested beside their modules; the
//! readers (Kubernetes, Prometheus) put a timeout on every call. [`crd_compat`] and [`schema`] are
//! pure and also serve `fleetgate check-crd` and `fleetgate validate`.

mod cel_health;
pub mod crd_compat;
mod evaluation;
mod preapply;
mod prometheus;
mod requires;
mod runner;
pub mod schema;
mod webhook;
mod workload;

pub use cel_health::{CelGateError, ForeignGateKind, GateKindError, check_gate_kinds};
pub use evaluation::{GateEvaluation, Threshold, Verdict};
pub use preapply::{InvalidObject, PreapplyBlock, PreapplyReport, preapply, read_cluster_facts};
pub use prometheus::{
    PrometheusAuth, PrometheusClient, PrometheusEndpoints, PrometheusError, PrometheusSource, Sample,
};
pub use requires::{RequirementError, check_requirements};
pub use runner::{BakeVerdict, Baseline, GateRunner, OperatorTarget, Round, decide, sample_baseline};
pub use workload::restart_counts;

use crate::model::{ErrorClass, GatePolicyProblem};
use std::future::Future;
use std::time::Duration;

/// Why gates could not be run at all (as opposed to a gate failing, which is a [`Verdict`]).
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("the gate policy cannot be evaluated: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidPolicy(Vec<GatePolicyProblem>),
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{what}: no answer within {after:?}")]
    Timeout { what: String, after: Duration },
    #[error("Prometheus client")]
    Prometheus(#[from] PrometheusError),
}

impl GateError {
    /// A policy that cannot be evaluated stalls until Git changes it; cluster and network trouble
    /// is worth retrying.
    pub fn class(&self) -> ErrorClass {
        match self {
            GateError::InvalidPolicy(_) => ErrorClass::Stalling,
            GateError::Kube { .. } | GateError::Timeout { .. } | GateError::Prometheus(_) => ErrorClass::Retryable,
        }
    }
}

/// One Kubernetes call with a timeout; `what` names it in errors.
pub(crate) async fn call<T>(
    what: impl Into<String>,
    after: Duration,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, GateError> {
    match tokio::time::timeout(after, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(GateError::Kube { what: what.into(), source }),
        Err(_) => Err(GateError::Timeout { what: what.into(), after }),
    }
}
