//! What one gate said in one round: observed figure, threshold, verdict — rendered for people
//! (`error-rate 7.3 % > 5 %`) and serialized for statuses.

use crate::model::{OnUnknown, Quantity};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The outcome of one gate in one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "camelCase")]
pub enum Verdict {
    Pass,
    Fail,
    /// The data needed to decide is missing (no samples, call timed out, rollout still running).
    Unknown {
        reason: String,
    },
}

/// What the observed figure is compared with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Threshold {
    AtMost {
        limit: Quantity,
    },
    AtLeast {
        limit: Quantity,
    },
    /// `limit = baseline × (1 + increase)`; baseline sampled before the apply.
    #[serde(rename_all = "camelCase")]
    AtMostOverBaseline {
        baseline: Quantity,
        increase: Quantity,
        limit: Quantity,
    },
    /// A relative gate whose baseline could not be sampled.
    #[serde(rename_all = "camelCase")]
    IncreaseOverMissingBaseline {
        increase: Quantity,
    },
    /// A yes/no expectation, e.g. "dry-run create accepted".
    Expect {
        what: String,
    },
}

impl Threshold {
    /// Whether `observed` is inside the threshold; `None` for yes/no expectations.
    pub fn holds(&self, observed: f64) -> Option<bool> {
        match self {
            Threshold::AtMost { limit } | Threshold::AtMostOverBaseline { limit, .. } => Some(observed <= limit.value),
            Threshold::AtLeast { limit } => Some(observed >= limit.value),
            Threshold::IncreaseOverMissingBaseline { .. } | Threshold::Expect { .. } => None,
        }
    }

    /// `≤ 5 %`, `≥ 100 %`, `≤ 120 ms (baseline 100 ms + 20 %)`.
    fn describe(&self, holds: bool) -> String {
        match self {
            Threshold::AtMost { limit } => format!("{} {limit}", if holds { "≤" } else { ">" }),
            Threshold::AtLeast { limit } => format!("{} {limit}", if holds { "≥" } else { "<" }),
            Threshold::AtMostOverBaseline { baseline, increase, limit } => {
                format!("{} {limit} (baseline {baseline} + {increase})", if holds { "≤" } else { ">" })
            }
            Threshold::IncreaseOverMissingBaseline { increase } => format!("≤ baseline + {increase} (no baseline)"),
            Threshold::Expect { what } => what.clone(),
        }
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(true))
    }
}

/// One gate's evaluation in one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateEvaluation {
    pub gate: String,
    #[serde(flatten)]
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<Quantity>,
    pub threshold: Threshold,
    /// Which objects or series made the figure (failing pods, unhealthy objects, the worst series).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl GateEvaluation {
    /// Pass or fail from comparing `observed` with `threshold`.
    pub fn compare(gate: &str, observed: Quantity, threshold: Threshold, detail: Option<String>) -> GateEvaluation {
        let verdict = match threshold.holds(observed.value) {
            Some(false) => Verdict::Fail,
            _ => Verdict::Pass,
        };
        GateEvaluation { gate: gate.to_string(), verdict, observed: Some(observed), threshold, detail }
    }

    pub fn unknown(gate: &str, reason: impl Into<String>, threshold: Threshold) -> GateEvaluation {
        GateEvaluation {
            gate: gate.to_string(),
            verdict: Verdict::Unknown { reason: reason.into() },
            observed: None,
            threshold,
            detail: None,
        }
    }

    /// A gate that cannot be evaluated as configured fails at once, whatever `onUnknown` says:
    /// waiting does not fix a policy, and ignoring it would let a release pass unchecked. The
    /// error is the detail, so it must not quote object data.
    pub fn misconfigured(gate: &str, error: &dyn std::error::Error, threshold: Threshold) -> GateEvaluation {
        GateEvaluation {
            gate: gate.to_string(),
            verdict: Verdict::Fail,
            observed: None,
            threshold,
            detail: Some(error.to_string()),
        }
    }

    pub fn is_pass(&self) -> bool {
        self.verdict == Verdict::Pass
    }

    pub fn is_fail(&self) -> bool {
        self.verdict == Verdict::Fail
    }

    pub fn is_unknown(&self) -> bool {
        matches!(self.verdict, Verdict::Unknown { .. })
    }

    /// Whether this evaluation ends the bake as failed: at once (`fail`, or `unknown` under
    /// `onUnknown: fail`), or at the end of the bake time (`unknown` under `failAfterBake`).
    pub fn fails_release(&self, on_unknown: OnUnknown, bake_over: bool) -> bool {
        match self.verdict {
            Verdict::Pass => false,
            Verdict::Fail => true,
            Verdict::Unknown { .. } => match on_unknown {
                OnUnknown::Fail => true,
                OnUnknown::FailAfterBake => bake_over,
                OnUnknown::Ignore => false,
            },
        }
    }
}

/// `error-rate 7.3 % > 5 %`, `pod-restarts 0 ≤ 3`, `p99 unknown (query returned no samples; threshold ≤ 500 ms)`.
impl fmt::Display for GateEvaluation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.gate)?;
        match (&self.verdict, &self.observed) {
            (Verdict::Unknown { reason }, observed) => {
                write!(f, " unknown ({reason}")?;
                if let Some(o) = observed {
                    write!(f, "; observed {o}")?;
                }
                write!(f, "; threshold {})", self.threshold)?;
            }
            (verdict, Some(o)) => {
                let holds = self.threshold.holds(o.value).unwrap_or(*verdict == Verdict::Pass);
                write!(f, " {o} {}", self.threshold.describe(holds))?;
            }
            (Verdict::Pass, None) => write!(f, " ok: {}", self.threshold)?,
            (Verdict::Fail, None) => write!(f, " failed (want {})", self.threshold)?,
        }
        if let Some(d) = &self.detail {
            write!(f, " — {d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn at_most(limit: Quantity) -> Threshold {
        Threshold::AtMost { limit }
    }

    #[rstest]
    #[case::error_rate_fails(
        GateEvaluation::compare("error-rate", Quantity::percent(0.073), at_most(Quantity::percent(0.05)), None),
        "error-rate 7.3 % > 5 %"
    )]
    #[case::error_rate_passes(
        GateEvaluation::compare("error-rate", Quantity::percent(0.021), at_most(Quantity::percent(0.05)), None),
        "error-rate 2.1 % ≤ 5 %"
    )]
    #[case::p99(
        GateEvaluation::compare("p99", Quantity::seconds(0.7425), at_most(Quantity::seconds(0.5)), None),
        "p99 742.5 ms > 500 ms"
    )]
    #[case::restarts(GateEvaluation::compare("pod-restarts", Quantity::number(5.0), at_most(Quantity::number(3.0)), Some("operator/op-1: 5".into())), "pod-restarts 5 > 3 — operator/op-1: 5")]
    #[case::ratio(GateEvaluation::compare("ready", Quantity::percent(2.0 / 3.0), Threshold::AtLeast { limit: Quantity::percent(1.0) }, None), "ready 66.7 % < 100 %")]
    #[case::baseline(GateEvaluation::compare("reconcile", Quantity::seconds(0.13), Threshold::AtMostOverBaseline { baseline: Quantity::seconds(0.1), increase: Quantity::percent(0.2), limit: Quantity::seconds(0.12) }, None), "reconcile 130 ms > 120 ms (baseline 100 ms + 20 %)")]
    #[case::unknown(
        GateEvaluation::unknown("p99", "query returned no samples", at_most(Quantity::seconds(0.5))),
        "p99 unknown (query returned no samples; threshold ≤ 500 ms)"
    )]
    #[case::expect_pass(GateEvaluation { gate: "webhook".into(), verdict: Verdict::Pass, observed: None, threshold: Threshold::Expect { what: "dry-run create accepted".into() }, detail: None }, "webhook ok: dry-run create accepted")]
    #[case::expect_fail(GateEvaluation { gate: "webhook".into(), verdict: Verdict::Fail, observed: None, threshold: Threshold::Expect { what: "dry-run create accepted".into() }, detail: Some("failed calling webhook".into()) }, "webhook failed (want dry-run create accepted) — failed calling webhook")]
    fn evaluations_read_like_sentences(#[case] e: GateEvaluation, #[case] want: &str) {
        assert_eq!(e.to_string(), want);
    }

    #[test]
    fn evaluations_serialize_flat_for_statuses() {
        let e = GateEvaluation::compare("error-rate", Quantity::percent(0.073), at_most(Quantity::percent(0.05)), None);
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["gate"], "error-rate");
        assert_eq!(v["verdict"], "fail");
        assert_eq!(v["observed"]["value"], 0.073);
        assert_eq!(v["threshold"]["type"], "atMost");
        assert_eq!(serde_json::from_value::<GateEvaluation>(v).unwrap(), e);
        let u =
            serde_json::to_value(GateEvaluation::unknown("x", "timed out", at_most(Quantity::number(1.0)))).unwrap();
        assert_eq!(u["verdict"], "unknown");
        assert_eq!(u["reason"], "timed out");
    }

    #[rstest]
    #[case(Verdict::Pass, OnUnknown::Fail, true, false)]
    #[case(Verdict::Fail, OnUnknown::Ignore, false, true)]
    #[case(Verdict::Unknown { reason: "x".into() }, OnUnknown::FailAfterBake, false, false)]
    #[case(Verdict::Unknown { reason: "x".into() }, OnUnknown::FailAfterBake, true, true)]
    #[case(Verdict::Unknown { reason: "x".into() }, OnUnknown::Fail, false, true)]
    #[case(Verdict::Unknown { reason: "x".into() }, OnUnknown::Ignore, true, false)]
    fn unknown_fails_as_the_policy_says(
        #[case] verdict: Verdict,
        #[case] on: OnUnknown,
        #[case] over: bool,
        #[case] fails: bool,
    ) {
        let e = GateEvaluation {
            gate: "g".into(),
            verdict,
            observed: None,
            threshold: at_most(Quantity::number(1.0)),
            detail: None,
        };
        assert_eq!(e.fails_release(on, over), fails);
    }
}
