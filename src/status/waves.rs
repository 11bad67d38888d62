//! Wave gating without a hub: whether a cluster may start a release now, decided from the fleet
//! (waves, clusters, what each desires) and the statuses every cluster wrote to Git.
//!
//! Rules, in the order they are checked:
//! 1. `maxFailedClusters` (fleet.yaml `spec.rollout`): once that many clusters report `failure` for
//!    a release, it is halted fleet-wide, in every wave (0 disables this rule).
//! 2. A `failure` for the release in an earlier wave blocks later waves. A failure counts whatever
//!    the failing cluster desires now: it is evidence about the release. A later `success` of that
//!    cluster for the same release supersedes it.
//! 3. Every cluster of an earlier wave that desires the release must report `success` for it.
//!    Clusters pinned to another release do not count.

use super::model::{State, StatusSet};
use crate::model::{Fleet, FleetConfig};
use serde::{Deserialize, Serialize};

/// A cluster as wave gating sees it: its wave and the release it should run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    pub name: String,
    pub wave: String,
    /// `None` when neither the cluster nor the fleet names a release.
    pub desired_release: Option<String>,
    /// The setting that pauses it, when Git does (`fleet.yaml` or its own `spec.paused`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
}

impl Member {
    pub fn new(name: impl Into<String>, wave: impl Into<String>, desired: Option<&str>) -> Member {
        Member { name: name.into(), wave: wave.into(), desired_release: desired.map(str::to_string), paused: None }
    }
}

/// Members of the fleet with their desired release, as the branch tip's configuration says
/// ([`FleetConfig::desired_release`]: the cluster's pin, else the fleet's release).
pub fn members(config: &FleetConfig) -> Vec<Member> {
    config
        .clusters
        .values()
        .map(|c| Member {
            paused: config.paused(c.name()).map(|by| by.setting(c.name())),
            ..Member::new(c.name(), &c.spec.wave, config.desired_release(c.name()).map(|(id, _)| id))
        })
        .collect()
}

/// The answer to "may this cluster start this release now?", with a reason a person can read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
    /// When waiting for earlier waves: every cluster of them that must still report success (the
    /// gate cannot open before each has written a new status). Empty otherwise, and when halted
    /// by failures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits_for: Vec<String>,
}

impl Decision {
    fn allow(reason: String) -> Decision {
        Decision { allowed: true, reason, waits_for: Vec::new() }
    }
    fn deny(reason: String) -> Decision {
        Decision { allowed: false, reason, waits_for: Vec::new() }
    }
}

/// How many names a reason lists before "and N more".
const LISTED: usize = 3;

fn listing(items: &[String]) -> String {
    if items.len() <= LISTED {
        items.join(", ")
    } else {
        format!("{} and {} more", items[..LISTED].join(", "), items.len() - LISTED)
    }
}

/// Whether `cluster` may start `release` now. Pure: the caller supplies the fleet, its members
/// (see [`members`]) and the statuses read from Git.
pub fn may_start(fleet: &Fleet, members: &[Member], statuses: &StatusSet, cluster: &str, release: &str) -> Decision {
    let waves = &fleet.spec.waves;
    let Some(me) = members.iter().find(|m| m.name == cluster) else {
        return Decision::deny(format!("cluster {cluster} is not in the fleet (no clusters/{cluster}.yaml)"));
    };
    let Some(my_wave) = waves.iter().position(|w| *w == me.wave) else {
        return Decision::deny(format!(
            "cluster {cluster} names wave {}, which fleet.yaml does not list (waves: {})",
            me.wave,
            waves.join(", ")
        ));
    };
    let state_of = |m: &Member| statuses.latest(&m.name, release).map(|s| s.state);

    let max_failed = fleet.spec.rollout.max_failed_clusters as usize;
    if max_failed > 0 {
        let failed: Vec<String> =
            members.iter().filter(|m| state_of(m) == Some(State::Failure)).map(|m| m.name.clone()).collect();
        if failed.len() >= max_failed {
            let why = |c: &str| statuses.latest(c, release).map(|s| s.description.clone()).unwrap_or_default();
            let who = if failed.len() == 1 {
                format!("{}: {}", failed[0], why(&failed[0]))
            } else {
                format!("{} — {}: {}", listing(&failed), failed[0], why(&failed[0]))
            };
            return Decision::deny(format!(
                "release {release} is halted fleet-wide: {} cluster{} failed (maxFailedClusters {max_failed}): {who}",
                failed.len(),
                if failed.len() == 1 { "" } else { "s" },
            ));
        }
    }

    let earlier = |m: &&Member| waves.iter().position(|w| *w == m.wave).is_some_and(|i| i < my_wave);
    if let Some(failed) = members.iter().filter(earlier).find(|m| state_of(m) == Some(State::Failure)) {
        let desc = statuses.latest(&failed.name, release).map(|s| s.description.as_str()).unwrap_or_default();
        return Decision::deny(format!(
            "blocked: {} in earlier wave {} failed {release}: {desc}",
            failed.name, failed.wave
        ));
    }

    let unfinished = |m: &&Member| m.desired_release.as_deref() == Some(release) && state_of(m) != Some(State::Success);
    let waits_for: Vec<String> = members.iter().filter(earlier).filter(unfinished).map(|m| m.name.clone()).collect();
    for wave in &waves[..my_wave] {
        let waiting: Vec<String> = members
            .iter()
            .filter(|m| m.wave == *wave)
            .filter(unfinished)
            .map(|m| match state_of(m) {
                Some(state) => format!("{} {state}", m.name),
                None => format!("{} no status yet", m.name),
            })
            .collect();
        if !waiting.is_empty() {
            let mut decision = Decision::deny(format!("waiting for wave {wave}: {}", listing(&waiting)));
            decision.waits_for = waits_for;
            return decision;
        }
    }

    if my_wave == 0 {
        Decision::allow(format!("{} is the first wave", me.wave))
    } else {
        Decision::allow(format!("every earlier wave ({}) reports success for {release}", waves[..my_wave].join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Document, FleetSpec, OperatorIdentity, RolloutSettings};
    use crate::status::Status;
    use rstest::rstest;

    const R: &str = "rel-9";

    fn fleet(max_failed: u32) -> Fleet {
        Document::new(
            "Fleet",
            "fleet",
            FleetSpec {
                operator: OperatorIdentity { name: "op".into(), namespace: "op-system".into(), image: None },
                release: Some(R.into()),
                waves: vec!["canary".into(), "early".into(), "prod".into()],
                rollout: RolloutSettings { max_failed_clusters: max_failed },
                promotions: Default::default(),
                status: Default::default(),
                paused: false,
            },
        )
    }

    /// canary: a, b · early: c, d (d pinned to rel-8) · prod: e, f
    fn fleet_members() -> Vec<Member> {
        vec![
            Member::new("a", "canary", Some(R)),
            Member::new("b", "canary", Some(R)),
            Member::new("c", "early", Some(R)),
            Member::new("d", "early", Some("rel-8")),
            Member::new("e", "prod", Some(R)),
            Member::new("f", "prod", Some(R)),
        ]
    }

    fn status(cluster: &str, state: State) -> Status {
        let desc = match state {
            State::Failure => "rolled back to rel-8: error-rate 7.3 % > 5 %".to_string(),
            other => other.to_string(),
        };
        Status::new(cluster, R, "0".repeat(40), state, desc)
    }

    use State::*;

    #[rstest]
    #[case::first_wave_always_may_start("a", &[], 1, true, "canary is the first wave")]
    #[case::earlier_wave_has_no_status("c", &[("a", Success)], 1, false, "waiting for wave canary: b no status yet")]
    #[case::earlier_wave_pending("c", &[("a", Success), ("b", Pending)], 1, false, "waiting for wave canary: b pending")]
    #[case::earlier_wave_error_waits("c", &[("a", Error), ("b", Success)], 1, false, "waiting for wave canary: a error")]
    #[case::earlier_wave_all_success("c", &[("a", Success), ("b", Success)], 1, true, "every earlier wave (canary) reports success for rel-9")]
    #[case::pinned_elsewhere_does_not_count("e", &[("a", Success), ("b", Success), ("c", Success)], 1, true, "every earlier wave (canary, early)")]
    #[case::second_wave_still_waits_on_its_own_clusters("e", &[("a", Success), ("b", Success)], 1, false, "waiting for wave early: c no status yet")]
    #[case::failure_in_earlier_wave_blocks("c", &[("a", Failure), ("b", Success)], 2, false, "blocked: a in earlier wave canary failed rel-9: rolled back to rel-8: error-rate 7.3 % > 5 %")]
    #[case::failure_of_a_pinned_cluster_still_blocks("e", &[("a", Success), ("b", Success), ("c", Success), ("d", Failure)], 2, false, "blocked: d in earlier wave early failed")]
    #[case::failure_in_same_wave_does_not_block_below_max("b", &[("a", Failure)], 2, true, "canary is the first wave")]
    #[case::max_failed_halts_every_wave("b", &[("a", Failure)], 1, false, "release rel-9 is halted fleet-wide: 1 cluster failed (maxFailedClusters 1): a: rolled back")]
    #[case::max_failed_counts_across_waves("a", &[("c", Failure), ("e", Failure)], 2, false, "halted fleet-wide: 2 clusters failed (maxFailedClusters 2): c, e — c: rolled back")]
    #[case::max_failed_zero_disables_the_halt("b", &[("a", Failure)], 0, true, "canary is the first wave")]
    #[case::later_success_supersedes_failure("c", &[("a", Failure), ("a", Success), ("b", Success)], 1, true, "every earlier wave")]
    #[case::unknown_cluster("zz", &[], 1, false, "cluster zz is not in the fleet")]
    fn wave_gating(
        #[case] cluster: &str,
        #[case] reported: &[(&str, State)],
        #[case] max_failed: u32,
        #[case] allowed: bool,
        #[case] reason: &str,
    ) {
        let mut set = StatusSet::new();
        for (i, (c, st)) in reported.iter().enumerate() {
            let mut s = status(c, *st);
            s.reported_at += chrono::Duration::seconds(i as i64);
            set.insert(s);
        }
        let d = may_start(&fleet(max_failed), &fleet_members(), &set, cluster, R);
        assert_eq!(d.allowed, allowed, "{d:?}");
        assert!(d.reason.contains(reason), "reason {:?} lacks {reason:?}", d.reason);
    }

    /// What a waiting agent's notes schedule waits for: every unfinished cluster of every earlier
    /// wave (not only the first unfinished wave, which the reason names), none when halted.
    #[rstest]
    #[case::all_earlier_waves("e", &[("a", Success)], 1, &["b", "c"])]
    #[case::pinned_elsewhere_left_out("e", &[("a", Success), ("b", Success)], 1, &["c"])]
    #[case::pending_still_waited_for("c", &[("a", Pending), ("b", Success)], 1, &["a"])]
    #[case::halted_waits_for_no_one("e", &[("a", Failure)], 1, &[])]
    #[case::blocked_waits_for_no_one("e", &[("a", Failure)], 2, &[])]
    #[case::allowed_waits_for_no_one("a", &[], 1, &[])]
    fn waits_for(
        #[case] cluster: &str,
        #[case] reported: &[(&str, State)],
        #[case] max_failed: u32,
        #[case] expected: &[&str],
    ) {
        let mut set = StatusSet::new();
        for (c, st) in reported {
            set.insert(status(c, *st));
        }
        let d = may_start(&fleet(max_failed), &fleet_members(), &set, cluster, R);
        assert_eq!(d.waits_for, expected, "{d:?}");
    }

    #[test]
    fn unknown_waves_are_named() {
        let members = vec![Member::new("x", "staging", Some(R))];
        let d = may_start(&fleet(1), &members, &StatusSet::new(), "x", R);
        assert!(!d.allowed);
        assert!(d.reason.contains("wave staging, which fleet.yaml does not list"), "{}", d.reason);
    }

    #[test]
    fn long_waiting_lists_are_shortened() {
        let mut members: Vec<Member> = (0..6).map(|i| Member::new(format!("c{i}"), "canary", Some(R))).collect();
        members.push(Member::new("p", "early", Some(R)));
        let d = may_start(&fleet(1), &members, &StatusSet::new(), "p", R);
        assert_eq!(
            d.reason,
            "waiting for wave canary: c0 no status yet, c1 no status yet, c2 no status yet and 3 more"
        );
    }

    #[test]
    fn members_take_the_pin_else_the_fleet_release() {
        use crate::model::ClusterSpec;
        let pinned =
            Document::new("Cluster", "a", ClusterSpec { wave: "canary".into(), release: Some("rel-8".into()), status_key: None, paused: false });
        let free = Document::new("Cluster", "b", ClusterSpec { wave: "prod".into(), release: None, status_key: None, paused: false });
        let config = FleetConfig {
            fleet: fleet(1),
            clusters: [("a".to_string(), pinned), ("b".to_string(), free)].into_iter().collect(),
            gate_policies: Vec::new(),
            admission_policies: Vec::new(),
        };
        let m = members(&config);
        assert_eq!(m[0], Member::new("a", "canary", Some("rel-8")));
        assert_eq!(m[1], Member::new("b", "prod", Some(R)));
    }
}
