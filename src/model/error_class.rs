//! [`ErrorClass`]: how a caller should react to a stage's error. Every stage error type sorts
//! itself with a `class()` method, so the agent's retry policy follows from the kind of error
//! instead of from string matching.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorClass {
    /// Retrying the same input cannot help (bad signature, invalid mapping, missing cluster):
    /// wait until Git changes, and report.
    Stalling,
    /// Transient (network, I/O, a Git server restarting): retry with backoff.
    Retryable,
}
