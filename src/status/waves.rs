//! Wave gating without a hub: whether a cluster may start a release now, decided from the fleet
//! (waves, clusters, what each desires), the statuses every cluster wrote to Git, and the time.
//!
//! Rules, in the order they are checked:
//! 1. `maxFailedClusters` (fleet.yaml `spec.rollout`): once that many clusters report `failure` for
//!    a release, it is halted fleet-wide, in every wave (0 disables this rule).
//! 2. A `failure` for the release in an earlier wave blocks later waves. A failure counts whatever
//!    the failing cluster desires now: it is evidence about the release. A later `success` of that
//!    cluster for the same release supersedes it.
//! 3. Every cluster of an earlier wave that desires the release must report `success` for it.
//!    Clusters pinned to another release do not count.
//!
//! Then the pacing of the waves (`model::wave`), which never holds a move back to an older
//! release ([`Move::Back`]: a rollback is never held):
//! 4. `soak` of an earlier wave: its last success for the release must be at least that old.
//! 5. `windows` of the cluster's own wave: one of them must be open now.
//! 6. `maxUnavailable` of the cluster's own wave: at most that many of its clusters are mid-release
//!    (latest status `pending`, not a pause). Seats go first to those already mid-release, then to
//!    the wave's clusters without a status for the release, in rendezvous order
//!    ([`crate::model::rendezvous`]): two agents that read the same statuses agree on who starts.
//!
//! Last, a wave with `approval: required` starts a release only once it is approved for it (a
//! signed tag the agent verifies with its approvers' keys, `release::check_approval`); meanwhile
//! its clusters report `pending` with [`awaiting_approval`]'s description, which (like a pause)
//! does not count as mid-release. An approval, like the pacing, never holds a move back.
//!
//! Races left: each agent judges from its own last fetch of the notes, so the seats are only as
//! fair as those reads are fresh — an agent that has not yet seen a wave-mate's `pending` still
//! waits for it as a cluster ahead of it in the order, but two agents whose configurations differ
//! (one fetched a tip that adds a cluster to the wave, one did not) can rank differently and both
//! start. A wave-mate ahead in the order that never starts (its agent is down, its statuses do not
//! verify) holds the ones behind it, as it would hold the next wave. Times are the writers' own
//! (`reportedAt`, signed with their status key) against the reader's clock: the soak is only as
//! exact as the clocks agree.

use super::model::{AWAITING_APPROVAL_PREFIX, PAUSED_PREFIX, State, Status, StatusSet};
use crate::model::{Fleet, FleetConfig, rendezvous};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    /// Its `metadata.labels` at the branch tip (what `fleetgate status -l` selects by).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl Member {
    pub fn new(name: impl Into<String>, wave: impl Into<String>, desired: Option<&str>) -> Member {
        Member {
            name: name.into(),
            wave: wave.into(),
            desired_release: desired.map(str::to_string),
            paused: None,
            labels: BTreeMap::new(),
        }
    }
}

/// Members of the fleet with their wave and desired release, as one configuration says
/// ([`FleetConfig::wave_of`], [`FleetConfig::desired_release`]: the cluster's pin, else the
/// fleet's release).
pub fn members(config: &FleetConfig) -> Vec<Member> {
    members_placed_by(config, config)
}

/// Members with what each desires (and whether it is paused) from `tip`, but their waves from
/// `trusted` — the configuration the agent trusts its safety settings from — so an unsigned push
/// cannot move a cluster to an earlier wave or out of one. A cluster `trusted` does not describe
/// rolls out with its last wave.
pub fn members_placed_by(tip: &FleetConfig, trusted: &FleetConfig) -> Vec<Member> {
    let placements = trusted.placements();
    let waves = &trusted.fleet.spec.waves;
    let last = waves.last().map(|w| w.name.as_str()).unwrap_or_default();
    tip.clusters
        .values()
        .map(|c| Member {
            paused: tip.paused(c.name()).map(|by| by.setting(c.name())),
            labels: c.metadata.labels.clone(),
            ..Member::new(
                c.name(),
                placements.get(c.name()).map_or(last, |p| waves[p.wave].name.as_str()),
                tip.desired_release(c.name()).map(|(id, _)| id),
            )
        })
        .collect()
}

/// Which way a start moves the cluster: pacing (soak, windows, maxUnavailable) holds only a move
/// forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    Forward,
    /// To a release older than the newest it ran: a rollback by Git.
    Back,
}

/// The answer to "may this cluster start this release now?", with a reason a person can read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
    /// When waiting: every cluster that must still write a status before the gate can open. Empty
    /// otherwise, when halted by failures, and when only time opens it ([`Self::retry_at`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits_for: Vec<String>,
    /// When waiting for time (a soak, a window): when to ask again.
    #[serde(default, rename = "retryAt", skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<DateTime<Utc>>,
}

impl Decision {
    fn allow(reason: String) -> Decision {
        Decision { allowed: true, reason, waits_for: Vec::new(), retry_at: None }
    }
    fn deny(reason: String) -> Decision {
        Decision { allowed: false, reason, waits_for: Vec::new(), retry_at: None }
    }
    fn until(reason: String, at: Option<DateTime<Utc>>) -> Decision {
        Decision { retry_at: at, ..Decision::deny(reason) }
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

/// `2026-12-07T10:42:00Z (3m12s left)`.
fn until(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (at - now).num_seconds().max(1);
    let left = match secs {
        3600.. => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        60.. => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{secs}s"),
    };
    format!("{} ({left} left)", at.to_rfc3339_opts(SecondsFormat::Secs, true))
}

/// Whether `cluster` may start `release` at `now`. Pure: the caller supplies the fleet (whose
/// waves and rollout settings apply), its members (see [`members`]) and the statuses read from Git.
pub fn may_start(
    fleet: &Fleet,
    members: &[Member],
    statuses: &StatusSet,
    cluster: &str,
    release: &str,
    now: DateTime<Utc>,
    movement: Move,
) -> Decision {
    let waves = &fleet.spec.waves;
    let Some(me) = members.iter().find(|m| m.name == cluster) else {
        return Decision::deny(format!("cluster {cluster} is not in the fleet (no clusters/{cluster}.yaml)"));
    };
    let Some((my_wave, wave)) = fleet.spec.wave(&me.wave) else {
        return Decision::deny(format!(
            "cluster {cluster} names wave {}, which fleet.yaml does not list (waves: {})",
            me.wave,
            fleet.spec.wave_names().join(", ")
        ));
    };
    let latest = |m: &Member| statuses.latest(&m.name, release);
    let state_of = |m: &Member| latest(m).map(|s| s.state);

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

    let position = |m: &Member| fleet.spec.wave(&m.wave).map(|(i, _)| i);
    let earlier = |m: &&Member| position(m).is_some_and(|i| i < my_wave);
    if let Some(failed) = members.iter().filter(earlier).find(|m| state_of(m) == Some(State::Failure)) {
        let desc = statuses.latest(&failed.name, release).map(|s| s.description.as_str()).unwrap_or_default();
        return Decision::deny(format!(
            "blocked: {} in earlier wave {} failed {release}: {desc}",
            failed.name, failed.wave
        ));
    }

    let desires = |m: &&Member| m.desired_release.as_deref() == Some(release);
    let unfinished = |m: &&Member| desires(m) && state_of(m) != Some(State::Success);
    let waits_for: Vec<String> = members.iter().filter(earlier).filter(unfinished).map(|m| m.name.clone()).collect();
    for w in &waves[..my_wave] {
        let waiting: Vec<String> = members
            .iter()
            .filter(|m| m.wave == w.name)
            .filter(unfinished)
            .map(|m| match state_of(m) {
                Some(state) => format!("{} {state}", m.name),
                None => format!("{} no status yet", m.name),
            })
            .collect();
        if !waiting.is_empty() {
            let mut decision = Decision::deny(format!("waiting for wave {}: {}", w.name, listing(&waiting)));
            decision.waits_for = waits_for;
            return decision;
        }
    }

    let ready = if my_wave == 0 {
        format!("{} is the first wave", me.wave)
    } else {
        format!("every earlier wave ({}) reports success for {release}", fleet.spec.wave_names()[..my_wave].join(", "))
    };
    if movement == Move::Back {
        return Decision::allow(ready);
    }

    // 4. Soak: every earlier wave's last success must be old enough.
    for w in &waves[..my_wave] {
        let Some(soak) = w.soak.and_then(|s| chrono::Duration::from_std(s).ok()) else { continue };
        let last_success = members
            .iter()
            .filter(|m| m.wave == w.name)
            .filter(desires)
            .filter_map(|m| latest(m))
            .map(|s| s.reported_at)
            .max();
        if let Some(done) = last_success
            && now < done + soak
        {
            return Decision::until(
                format!("wave {} soaks until {}", w.name, until(done + soak, now)),
                Some(done + soak),
            );
        }
    }

    // 5. Windows of this cluster's wave.
    if let Err(next) = wave.window_at(now) {
        let windows: Vec<String> = wave.windows.iter().map(ToString::to_string).collect();
        let opens = next.map(|at| format!("; next opens {}", until(at, now))).unwrap_or_default();
        return Decision::until(
            format!("wave {} is outside its windows ({}){opens}", wave.name, windows.join(", ")),
            next,
        );
    }

    // 6. maxUnavailable: seats go to those mid-release, then to those not started, in rendezvous order.
    if let Some(max) = wave.max_unavailable {
        let held = |s: &Status| [PAUSED_PREFIX, AWAITING_APPROVAL_PREFIX].iter().any(|p| s.description.starts_with(p));
        let in_flight = |s: &Status| s.state == State::Pending && !held(s);
        let score = |m: &Member| rendezvous(fleet.name(), &wave.name, &m.name);
        let mine = score(me);
        let mates: Vec<&Member> = members
            .iter()
            .filter(|m| m.wave == me.wave && m.name != me.name && m.paused.is_none())
            .filter(desires)
            .collect();
        let mut ahead: Vec<&&Member> = mates.iter().filter(|m| latest(m).is_none() && score(m) > mine).collect();
        ahead.sort_by_key(|m| std::cmp::Reverse(score(m)));
        let seats: Vec<(&str, &str)> = mates
            .iter()
            .filter(|m| latest(m).is_some_and(in_flight))
            .map(|m| (m.name.as_str(), "mid-release"))
            .chain(ahead.iter().map(|m| (m.name.as_str(), "goes first")))
            .collect();
        if seats.len() >= max as usize {
            let named: Vec<String> = seats.iter().map(|(name, why)| format!("{name} {why}")).collect();
            let mut decision =
                Decision::deny(format!("wave {} has maxUnavailable {max}: {}", wave.name, listing(&named)));
            decision.waits_for = seats.iter().map(|(name, _)| name.to_string()).collect();
            return decision;
        }
    }
    Decision::allow(ready)
}

/// The description of a cluster's `pending` status while its wave waits for an approval of
/// `release`, with the command that gives one, and why a tag that is there does not count.
pub fn awaiting_approval(release: &str, wave: &str, ignored: Option<&str>) -> String {
    let ask = format!("{AWAITING_APPROVAL_PREFIX}{wave} (fleetgate approve {release} --wave {wave})");
    match ignored {
        Some(why) => format!("{ask}; {why}"),
        None => ask,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Wave;
    use crate::model::{Document, FleetSpec, OperatorIdentity, RolloutSettings};
    use rstest::rstest;

    const R: &str = "rel-9";

    fn start(fleet: &Fleet, members: &[Member], statuses: &StatusSet, cluster: &str) -> Decision {
        may_start(fleet, members, statuses, cluster, R, Utc::now(), Move::Forward)
    }

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
        let d = start(&fleet(max_failed), &fleet_members(), &set, cluster);
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
        let d = start(&fleet(max_failed), &fleet_members(), &set, cluster);
        assert_eq!(d.waits_for, expected, "{d:?}");
    }

    #[test]
    fn unknown_waves_are_named() {
        let members = vec![Member::new("x", "staging", Some(R))];
        let d = start(&fleet(1), &members, &StatusSet::new(), "x");
        assert!(!d.allowed);
        assert!(d.reason.contains("wave staging, which fleet.yaml does not list"), "{}", d.reason);
    }

    #[test]
    fn long_waiting_lists_are_shortened() {
        let mut members: Vec<Member> = (0..6).map(|i| Member::new(format!("c{i}"), "canary", Some(R))).collect();
        members.push(Member::new("p", "early", Some(R)));
        let d = start(&fleet(1), &members, &StatusSet::new(), "p");
        assert_eq!(
            d.reason,
            "waiting for wave canary: c0 no status yet, c1 no status yet, c2 no status yet and 3 more"
        );
    }

    #[test]
    fn members_take_the_pin_else_the_fleet_release() {
        use crate::model::ClusterSpec;
        let pinned = Document::new(
            "Cluster",
            "a",
            ClusterSpec { wave: Some("canary".into()), release: Some("rel-8".into()), status_key: None, paused: false },
        );
        let free = Document::new(
            "Cluster",
            "b",
            ClusterSpec { wave: Some("prod".into()), release: None, status_key: None, paused: false },
        );
        let config = FleetConfig {
            fleet: fleet(1),
            clusters: [("a".to_string(), pinned), ("b".to_string(), free)].into_iter().collect(),
            gate_policies: Vec::new(),
            admission_policies: Vec::new(),
            admission_policy_files: Default::default(),
        };
        let m = members(&config);
        assert_eq!(m[0], Member::new("a", "canary", Some("rel-8")));
        assert_eq!(m[1], Member::new("b", "prod", Some(R)));
    }

    fn paced(canary: Wave, early: Wave) -> Fleet {
        let mut f = fleet(1);
        f.spec.waves = vec![canary, early, "prod".into()];
        f
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn reported(cluster: &str, state: State, when: &str) -> Status {
        let mut s = status(cluster, state);
        s.reported_at = at(when);
        s
    }

    #[rstest]
    #[case::soaking(
        "2026-12-07T10:39:00Z",
        false,
        "wave canary soaks until 2026-12-07T10:42:00Z (3m00s left)",
        Some("2026-12-07T10:42:00Z")
    )]
    #[case::soaked("2026-12-07T10:42:00Z", true, "every earlier wave (canary)", None)]
    fn soak_counts_from_the_last_success(
        #[case] now: &str,
        #[case] allowed: bool,
        #[case] reason: &str,
        #[case] retry: Option<&str>,
    ) {
        let soak = Wave { soak: Some(std::time::Duration::from_secs(600)), ..Wave::from("canary") };
        let set: StatusSet =
            [reported("a", Success, "2026-12-07T10:30:00Z"), reported("b", Success, "2026-12-07T10:32:00Z")]
                .into_iter()
                .collect();
        let d = may_start(&paced(soak, "early".into()), &fleet_members(), &set, "c", R, at(now), Move::Forward);
        assert_eq!((d.allowed, d.retry_at), (allowed, retry.map(at)), "{d:?}");
        assert!(d.reason.contains(reason), "{}", d.reason);
        assert!(d.waits_for.is_empty(), "only time opens a soak: {d:?}");
    }

    #[test]
    fn a_window_holds_a_start_but_never_a_move_back() {
        let window = serde_saphyr::from_str("{days: [Mon-Fri], start: '09:00', end: '17:00'}").unwrap();
        let canary = Wave { windows: vec![window], ..Wave::from("canary") };
        let f = paced(canary, "early".into());
        let saturday = at("2026-12-05T12:00:00Z");
        let d = may_start(&f, &fleet_members(), &StatusSet::new(), "a", R, saturday, Move::Forward);
        assert!(!d.allowed);
        assert_eq!(
            d.reason,
            "wave canary is outside its windows (Mon-Fri 09:00-17:00 UTC); next opens 2026-12-07T09:00:00Z (45h00m left)"
        );
        assert_eq!(d.retry_at, Some(at("2026-12-07T09:00:00Z")));
        assert!(may_start(&f, &fleet_members(), &StatusSet::new(), "a", R, saturday, Move::Back).allowed);
        assert!(
            may_start(&f, &fleet_members(), &StatusSet::new(), "a", R, at("2026-12-07T09:00:00Z"), Move::Forward)
                .allowed
        );
    }

    /// prod holds e and f; with maxUnavailable 1 the one first in rendezvous order goes first.
    #[test]
    fn max_unavailable_gives_seats_in_one_agreed_order() {
        let prod = Wave { max_unavailable: Some(1), ..Wave::from("prod") };
        let mut f = fleet(1);
        f.spec.waves = vec!["canary".into(), "early".into(), prod];
        let earlier: Vec<Status> = ["a", "b", "c"].iter().map(|c| status(c, Success)).collect();
        let decide = |extra: &[Status], who: &str| {
            let set: StatusSet = earlier.iter().chain(extra).cloned().collect();
            may_start(&f, &fleet_members(), &set, who, R, Utc::now(), Move::Forward)
        };
        let (first, second) =
            if rendezvous("fleet", "prod", "e") > rendezvous("fleet", "prod", "f") { ("e", "f") } else { ("f", "e") };
        // Nobody started: exactly one of the two may, and both agree which.
        assert!(decide(&[], first).allowed);
        let d = decide(&[], second);
        assert_eq!(
            (d.allowed, d.reason.as_str(), d.waits_for.as_slice()),
            (false, &*format!("wave prod has maxUnavailable 1: {first} goes first"), &[first.to_string()][..])
        );
        // The first is mid-release: the second still waits, now for it to finish.
        let d = decide(&[status(first, Pending)], second);
        assert_eq!((d.allowed, d.reason), (false, format!("wave prod has maxUnavailable 1: {first} mid-release")));
        // A pause is not mid-release, nor is waiting for an approval; the first finished: the second goes.
        let mut paused = status(first, Pending);
        paused.description = format!("{PAUSED_PREFIX}fleet.yaml spec.paused");
        assert!(decide(&[paused], second).allowed);
        let mut unapproved = status(first, Pending);
        unapproved.description = awaiting_approval(R, "prod", None);
        assert!(decide(&[unapproved], second).allowed);
        assert!(decide(&[status(first, Success)], second).allowed);
        // A move back is never held.
        let set: StatusSet = earlier.iter().cloned().chain([status(first, Pending)]).collect();
        assert!(may_start(&f, &fleet_members(), &set, second, R, Utc::now(), Move::Back).allowed);
    }

    #[test]
    fn trusted_waves_place_members_and_unknown_clusters_go_last() {
        use crate::model::ClusterSpec;
        let cluster = |name: &str, wave: &str| {
            Document::new(
                "Cluster",
                name,
                ClusterSpec { wave: Some(wave.into()), release: None, status_key: None, paused: false },
            )
        };
        let config = |clusters: Vec<(&str, &str)>| FleetConfig {
            fleet: fleet(1),
            clusters: clusters.into_iter().map(|(n, w)| (n.to_string(), cluster(n, w))).collect(),
            gate_policies: Vec::new(),
            admission_policies: Vec::new(),
            admission_policy_files: Default::default(),
        };
        // The tip moved a to canary and added n; the trusted tree has a in prod and no n.
        let tip = config(vec![("a", "canary"), ("n", "canary")]);
        let trusted = config(vec![("a", "prod"), ("b", "early")]);
        let m = members_placed_by(&tip, &trusted);
        assert_eq!(m, [Member::new("a", "prod", Some(R)), Member::new("n", "prod", Some(R))]);
    }

    #[test]
    fn waiting_for_approval_says_how_to_give_it_and_what_was_ignored() {
        assert_eq!(
            awaiting_approval(R, "prod", None),
            "waiting for approval of wave prod (fleetgate approve rel-9 --wave prod)"
        );
        assert_eq!(
            awaiting_approval(R, "prod", Some("tag approve/rel-9/prod is a lightweight tag")),
            "waiting for approval of wave prod (fleetgate approve rel-9 --wave prod); tag approve/rel-9/prod is a lightweight tag"
        );
    }
}
