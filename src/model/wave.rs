//! Waves as `fleet.yaml` `spec.waves` defines them, and which clusters each one holds.
//!
//! An entry of `spec.waves` is a name (clusters join it by naming it in their `spec.wave`) or a
//! definition ([`Wave`]): a `selector` over cluster labels, a `percent` of what it matches, how
//! many of its clusters may be mid-release at once (`maxUnavailable`), how long the fleet waits
//! after it succeeded before the next wave starts (`soak`), the `windows` in which it may start
//! a release, and whether a person must approve each release for it first (`approval`, the
//! signed tags named by [`super::approval_tag`]). The gating that reads these settings is `status::waves`.
//!
//! Membership ([`assign`]), in this order:
//! 1. a cluster whose `spec.wave` names a listed wave is in that wave, whatever selects it;
//! 2. each wave with a `selector` or a `percent`, in rollout order, takes the clusters its selector
//!    matches (all, without one) among those not placed yet; `percent` keeps that share of them,
//!    rounded up — at least one when any match — chosen by rendezvous (highest-random-weight)
//!    hashing: SHA-256 of (fleet name, wave name, cluster name), highest first;
//! 3. a cluster still unplaced rolls out with the last wave (latest is the safe side);
//!    `fleetgate validate` reports it, and a cluster that names one wave but matches another's
//!    selector.
//!
//! The choice is a function of the set of clusters only, so every agent computes the same one.
//! Adding a cluster never reshuffles a percentage wave: the new cluster may enter it, and then (when
//! the rounded count stays the same) the one cluster at the boundary leaves, or (when the count
//! grows) the next one in rendezvous order enters. No exact percentage can do better as a
//! function of the set alone.

use super::{ClusterIdentity, GateSelector};
use chrono::{DateTime, Datelike, Duration as Span, FixedOffset, NaiveTime, TimeZone, Utc, Weekday};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// One wave of `spec.waves`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Wave {
    pub name: String,
    /// Takes the clusters whose labels (or names) match, among those no earlier wave took.
    /// `waves` is not allowed here: membership is what is being decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<GateSelector>,
    /// Keeps this share (1–100) of what the selector matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u32>,
    /// At most this many of the wave's clusters are mid-release (status `pending`) at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<u32>,
    /// The next wave starts a release only this long after the last of this wave's successes.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub soak: Option<Duration>,
    /// When the wave may start a release; empty = always. A rollback is never held by them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<Window>,
    /// `required`: each release starts in this wave only once someone approved it for the wave.
    #[serde(default, skip_serializing_if = "ApprovalSetting::is_none")]
    pub approval: ApprovalSetting,
}

/// A wave's `approval`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ApprovalSetting {
    /// Starts when the gating lets it (the default).
    #[default]
    None,
    /// Also needs an approval of the release for this wave.
    Required,
}

impl ApprovalSetting {
    pub fn is_none(&self) -> bool {
        *self == ApprovalSetting::None
    }
}

impl From<&str> for Wave {
    fn from(name: &str) -> Wave {
        Wave { name: name.to_string(), ..Wave::default() }
    }
}

impl Wave {
    /// A wave only clusters naming it join, with no pacing: what a plain name in the list means.
    pub fn is_plain(&self) -> bool {
        *self == Wave::from(self.name.as_str())
    }

    /// Whether its selection takes clusters that do not name it.
    pub fn selects(&self) -> bool {
        self.selector.is_some() || self.percent.is_some()
    }

    /// Whether this wave's selector matches `cluster` (false for a wave that selects nothing).
    pub fn matches(&self, cluster: &ClusterIdentity<'_>) -> bool {
        self.selects() && self.selector.as_ref().is_none_or(|s| s.matches(cluster))
    }

    /// The window open at `now`, if the wave has windows: `Ok(())` when it may start now, else the
    /// next time one opens (`None` if never — a window on no day cannot be written).
    pub fn window_at(&self, now: DateTime<Utc>) -> Result<(), Option<DateTime<Utc>>> {
        if self.windows.is_empty() || self.windows.iter().any(|w| w.is_open(now)) {
            return Ok(());
        }
        Err(self.windows.iter().filter_map(|w| w.next_open(now)).min())
    }

    /// Its selection and pacing in one line (`tier=prod, 25 %; maxUnavailable 1; soak 10m; Mon-Fri
    /// 09:00-17:00 UTC`); None for a plain wave.
    pub fn summary(&self) -> Option<String> {
        let mut parts = Vec::new();
        let mut selection: Vec<String> = Vec::new();
        if let Some(s) = &self.selector {
            selection.extend(s.match_labels.iter().map(|(k, v)| format!("{k}={v}")));
            selection.extend(s.clusters.iter().cloned());
        }
        if let Some(p) = self.percent {
            selection.push(format!("{p} %"));
        }
        if !selection.is_empty() {
            parts.push(selection.join(", "));
        }
        if let Some(n) = self.max_unavailable {
            parts.push(format!("maxUnavailable {n}"));
        }
        if let Some(soak) = self.soak {
            parts.push(format!("soak {}", humantime::format_duration(soak)));
        }
        if !self.windows.is_empty() {
            parts.push(self.windows.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "));
        }
        if self.approval == ApprovalSetting::Required {
            parts.push("approval required".to_string());
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// Problems a definition has on its own, each one line.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let name = &self.name;
        if let Some(p) = self.percent
            && !(1..=100).contains(&p)
        {
            out.push(format!("wave {name:?}: percent must be 1 to 100, not {p}"));
        }
        if self.max_unavailable == Some(0) {
            out.push(format!("wave {name:?}: maxUnavailable must be at least 1 (0 would never start)"));
        }
        if self.selector.as_ref().is_some_and(|s| !s.waves.is_empty()) {
            out.push(format!("wave {name:?}: a wave's selector takes labels or cluster names, not waves"));
        }
        out
    }
}

/// `spec.waves`: each entry a wave name or a [`Wave`]; plain waves are written back as names.
pub(super) mod entries {
    use super::Wave;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Wave>, D::Error> {
        let values = Vec::<serde_json::Value>::deserialize(d)?;
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                serde_json::Value::String(name) => Ok(Wave::from(name.as_str())),
                v @ serde_json::Value::Object(_) => {
                    serde_json::from_value(v).map_err(|e| serde::de::Error::custom(format!("spec.waves[{i}]: {e}")))
                }
                _ => Err(serde::de::Error::custom(format!(
                    "spec.waves[{i}]: a wave is a name or {{name, selector, percent, maxUnavailable, soak, windows, approval}}"
                ))),
            })
            .collect()
    }

    pub fn serialize<S: Serializer>(waves: &[Wave], s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(untagged)]
        enum Entry<'a> {
            Name(&'a str),
            Wave(&'a Wave),
        }
        let entries: Vec<Entry<'_>> =
            waves.iter().map(|w| if w.is_plain() { Entry::Name(&w.name) } else { Entry::Wave(w) }).collect();
        entries.serialize(s)
    }
}

/// A time window: `days` (`Mon-Fri`, `Sat`; empty = every day), `start`–`end` as `HH:MM` in
/// `timeZone` (`UTC` or a fixed offset such as `+02:00`: no daylight-saving rules). An `end` at or
/// before `start` runs past midnight into the next day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Window {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub days: Vec<DaySpan>,
    pub start: ClockTime,
    pub end: ClockTime,
    #[serde(default)]
    pub time_zone: Zone,
}

impl Window {
    fn length(&self) -> Span {
        let len = self.end.0 - self.start.0;
        if len <= Span::zero() { len + Span::days(1) } else { len }
    }

    /// Opening times from the day before `now` on, a week and a day of them.
    fn openings(&self, now: DateTime<Utc>) -> impl Iterator<Item = DateTime<Utc>> + '_ {
        let zone = self.time_zone.0;
        let today = now.with_timezone(&zone).date_naive();
        (-1..=7).filter_map(move |d| {
            let day = today + Span::days(d);
            let listed = self.days.is_empty() || self.days.iter().any(|s| s.contains(day.weekday()));
            let open = zone.from_local_datetime(&day.and_time(self.start.0)).single()?;
            listed.then(|| open.with_timezone(&Utc))
        })
    }

    pub fn is_open(&self, now: DateTime<Utc>) -> bool {
        self.openings(now).any(|open| open <= now && now < open + self.length())
    }

    pub fn next_open(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.openings(now).find(|open| *open > now)
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let days: Vec<String> = self.days.iter().map(DaySpan::to_string).collect();
        if !days.is_empty() {
            write!(f, "{} ", days.join(","))?;
        }
        write!(f, "{}-{} {}", self.start, self.end, self.time_zone)
    }
}

/// A day (`Mon`) or a span of days (`Mon-Fri`, `Fri-Mon` wraps over the week's end).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DaySpan {
    pub from: Weekday,
    pub to: Weekday,
}

impl DaySpan {
    pub fn contains(&self, day: Weekday) -> bool {
        let (from, to, d) =
            (self.from.num_days_from_monday(), self.to.num_days_from_monday(), day.num_days_from_monday());
        if from <= to { (from..=to).contains(&d) } else { d >= from || d <= to }
    }
}

impl TryFrom<String> for DaySpan {
    type Error = String;
    fn try_from(s: String) -> Result<DaySpan, String> {
        let day = |d: &str| d.trim().parse::<Weekday>().map_err(|_| format!("{d:?} is not a day (Mon, Tue, …)"));
        match s.split_once('-') {
            Some((from, to)) => Ok(DaySpan { from: day(from)?, to: day(to)? }),
            None => day(&s).map(|d| DaySpan { from: d, to: d }),
        }
    }
}

impl fmt::Display for DaySpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.from == self.to { write!(f, "{}", self.from) } else { write!(f, "{}-{}", self.from, self.to) }
    }
}

impl From<DaySpan> for String {
    fn from(d: DaySpan) -> String {
        d.to_string()
    }
}

/// A time of day, `HH:MM`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClockTime(pub NaiveTime);

impl TryFrom<String> for ClockTime {
    type Error = String;
    fn try_from(s: String) -> Result<ClockTime, String> {
        NaiveTime::parse_from_str(&s, "%H:%M").map(ClockTime).map_err(|_| format!("{s:?} is not a time of day (HH:MM)"))
    }
}

impl fmt::Display for ClockTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.format("%H:%M"))
    }
}

impl From<ClockTime> for String {
    fn from(t: ClockTime) -> String {
        t.to_string()
    }
}

/// `UTC` or a fixed offset (`+02:00`, `-05:30`). Named zones with daylight saving are not read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Zone(pub FixedOffset);

impl Default for Zone {
    fn default() -> Zone {
        Zone(FixedOffset::east_opt(0).expect("zero is an offset"))
    }
}

impl TryFrom<String> for Zone {
    type Error = String;
    fn try_from(s: String) -> Result<Zone, String> {
        if s == "UTC" || s == "Z" {
            return Ok(Zone::default());
        }
        s.parse::<FixedOffset>().map(Zone).map_err(|_| {
            format!("timeZone {s:?} is not UTC or a fixed offset such as +02:00 (named zones are not supported)")
        })
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.local_minus_utc() == 0 { f.write_str("UTC") } else { write!(f, "{}", self.0) }
    }
}

impl From<Zone> for String {
    fn from(z: Zone) -> String {
        z.to_string()
    }
}

/// The rendezvous weight of `cluster` in `wave` of `fleet`: higher is chosen first.
pub fn rendezvous(fleet: &str, wave: &str, cluster: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [fleet, wave, cluster] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

/// How a cluster came to be in its wave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placed {
    /// Its `spec.wave` names the wave.
    Named,
    /// The wave's selector (and percentage) took it.
    Selected,
    /// No wave took it: it rolls out with the last wave.
    Unmatched,
}

/// A cluster's wave, by position in `spec.waves`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub wave: usize,
    pub by: Placed,
}

/// Places every cluster in a wave (see the module documentation). A cluster naming a wave that
/// is not listed is treated as naming none. Empty when there are no waves.
pub fn assign(fleet: &str, waves: &[Wave], clusters: &[ClusterIdentity<'_>]) -> BTreeMap<String, Placement> {
    let mut out = BTreeMap::new();
    let Some(last) = waves.len().checked_sub(1) else { return out };
    for c in clusters {
        if let Some(i) = c.wave.and_then(|w| waves.iter().position(|x| x.name == w)) {
            out.insert(c.name.to_string(), Placement { wave: i, by: Placed::Named });
        }
    }
    for (i, wave) in waves.iter().enumerate().filter(|(_, w)| w.selects()) {
        let mut matched: Vec<(&str, [u8; 32])> = clusters
            .iter()
            .filter(|c| !out.contains_key(c.name) && wave.matches(&ClusterIdentity { wave: None, ..**c }))
            .map(|c| (c.name, rendezvous(fleet, &wave.name, c.name)))
            .collect();
        matched.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let keep = match wave.percent {
            Some(p) => (matched.len() * p.min(100) as usize).div_ceil(100),
            None => matched.len(),
        };
        for (name, _) in matched.into_iter().take(keep) {
            out.insert(name.to_string(), Placement { wave: i, by: Placed::Selected });
        }
    }
    for c in clusters {
        out.entry(c.name.to_string()).or_insert(Placement { wave: last, by: Placed::Unmatched });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn prod_wave(name: &str, percent: Option<u32>) -> Wave {
        let selector = GateSelector { match_labels: labels(&[("tier", "prod")]), ..GateSelector::default() };
        Wave { name: name.into(), selector: Some(selector), percent, ..Wave::default() }
    }

    /// `n` clusters `c0…`, all labelled tier=prod, naming no wave.
    fn place(waves: &[Wave], names: &[String], prod: &BTreeMap<String, String>) -> BTreeMap<String, Placement> {
        let ids: Vec<ClusterIdentity<'_>> =
            names.iter().map(|n| ClusterIdentity { name: n, wave: None, labels: Some(prod) }).collect();
        assign("fleet", waves, &ids)
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("c{i}")).collect()
    }

    fn in_wave(p: &BTreeMap<String, Placement>, wave: usize) -> Vec<String> {
        p.iter().filter(|(_, pl)| pl.wave == wave).map(|(n, _)| n.clone()).collect()
    }

    #[rstest]
    #[case::quarter_of_eight(8, 25, 2)]
    #[case::rounds_up(9, 25, 3)]
    #[case::at_least_one(3, 1, 1)]
    #[case::all(5, 100, 5)]
    #[case::none_match(0, 50, 0)]
    #[case::half_of_seven(7, 50, 4)]
    fn percentages_round_up(#[case] n: usize, #[case] percent: u32, #[case] expected: usize) {
        let prod = labels(&[("tier", "prod")]);
        let waves = [Wave::from("canary"), prod_wave("prod-some", Some(percent)), prod_wave("prod-rest", None)];
        let p = place(&waves, &names(n), &prod);
        assert_eq!(in_wave(&p, 1).len(), expected);
        assert_eq!(in_wave(&p, 2).len(), n - expected);
        assert!(p.values().all(|pl| pl.by == Placed::Selected));
    }

    #[test]
    fn adding_clusters_never_reshuffles() {
        let prod = labels(&[("tier", "prod")]);
        let waves = [prod_wave("first", Some(25)), prod_wave("rest", None)];
        let mut before = in_wave(&place(&waves, &names(1), &prod), 0);
        for n in 2..200 {
            let all = names(n);
            let after = in_wave(&place(&waves, &all, &prod), 0);
            let new = &all[n - 1];
            let left: Vec<&String> = before.iter().filter(|c| !after.contains(c)).collect();
            let joined: Vec<&String> = after.iter().filter(|c| !before.contains(c) && *c != new).collect();
            assert!(left.len() + joined.len() <= 1, "adding {new} moved {left:?} out and {joined:?} in");
            // Whoever leaves makes room for the new cluster; whoever joins fills a new seat.
            assert!(left.is_empty() || after.contains(new), "{left:?} left without {new} joining");
            before = after;
        }
    }

    #[test]
    fn the_choice_depends_on_fleet_and_wave_not_on_order() {
        let prod = labels(&[("tier", "prod")]);
        let waves = [prod_wave("first", Some(50)), prod_wave("rest", None)];
        let mut reversed = names(20);
        reversed.reverse();
        assert_eq!(place(&waves, &names(20), &prod), place(&waves, &reversed, &prod));
        let other = [prod_wave("other", Some(50)), prod_wave("rest", None)];
        assert_ne!(in_wave(&place(&waves, &names(20), &prod), 0), in_wave(&place(&other, &names(20), &prod), 0));
    }

    #[test]
    fn precedence_named_then_selectors_in_order_then_last() {
        let prod = labels(&[("tier", "prod")]);
        let dev = labels(&[("tier", "dev")]);
        let ids = [
            // Names the last wave although the first selector matches it: spec.wave wins.
            ClusterIdentity { name: "named", wave: Some("late"), labels: Some(&prod) },
            ClusterIdentity { name: "p1", wave: None, labels: Some(&prod) },
            ClusterIdentity { name: "p2", wave: None, labels: Some(&prod) },
            ClusterIdentity { name: "d1", wave: None, labels: Some(&dev) },
            // Names a wave fleet.yaml does not list: as if it named none.
            ClusterIdentity { name: "lost", wave: Some("nope"), labels: None },
        ];
        let waves = [prod_wave("early", None), prod_wave("again", None), Wave::from("late")];
        let p = assign("fleet", &waves, &ids);
        let got: Vec<(&str, usize, Placed)> = p.iter().map(|(n, pl)| (n.as_str(), pl.wave, pl.by)).collect();
        assert_eq!(
            got,
            [
                ("d1", 2, Placed::Unmatched),
                ("lost", 2, Placed::Unmatched),
                ("named", 2, Placed::Named),
                ("p1", 0, Placed::Selected),
                ("p2", 0, Placed::Selected),
            ]
        );
    }

    #[test]
    fn a_percent_without_selector_takes_a_share_of_the_rest() {
        let none = BTreeMap::new();
        let waves = [Wave { percent: Some(10), ..Wave::from("canary") }, Wave::from("prod")];
        let p = place(&waves, &names(30), &none);
        assert_eq!((in_wave(&p, 0).len(), in_wave(&p, 1).len()), (3, 27));
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn window(yaml: &str) -> Window {
        serde_saphyr::from_str(yaml).unwrap()
    }

    // 2026-12-07 is a Monday.
    #[rstest]
    #[case::inside("{days: [Mon-Fri], start: '09:00', end: '17:00'}", "2026-12-07T10:00:00Z", Ok(()))]
    #[case::end_is_exclusive(
        "{days: [Mon-Fri], start: '09:00', end: '17:00'}",
        "2026-12-07T17:00:00Z",
        Err(Some("2026-12-08T09:00:00Z"))
    )]
    #[case::weekend_waits_for_monday(
        "{days: [Mon-Fri], start: '09:00', end: '17:00'}",
        "2026-12-05T12:00:00Z",
        Err(Some("2026-12-07T09:00:00Z"))
    )]
    #[case::offset("{days: [Mon], start: '09:00', end: '10:00', timeZone: '+02:00'}", "2026-12-07T07:30:00Z", Ok(()))]
    #[case::offset_before(
        "{days: [Mon], start: '09:00', end: '10:00', timeZone: '+02:00'}",
        "2026-12-07T06:30:00Z",
        Err(Some("2026-12-07T07:00:00Z"))
    )]
    #[case::past_midnight("{days: [Fri], start: '22:00', end: '02:00'}", "2026-12-05T01:00:00Z", Ok(()))]
    #[case::wrapping_days("{days: [Sat-Mon], start: '00:00', end: '00:00'}", "2026-12-07T23:59:00Z", Ok(()))]
    #[case::every_day("{start: '09:00', end: '09:30'}", "2026-12-08T08:00:00Z", Err(Some("2026-12-08T09:00:00Z")))]
    fn windows(#[case] yaml: &str, #[case] now: &str, #[case] expected: Result<(), Option<&str>>) {
        let wave = Wave { windows: vec![window(yaml)], ..Wave::from("w") };
        assert_eq!(wave.window_at(at(now)), expected.map_err(|e| e.map(at)));
    }

    #[rstest]
    #[case::bad_day("{days: [Mon-Fry], start: '09:00', end: '17:00'}", "\"Fry\" is not a day")]
    #[case::bad_time("{start: '9am', end: '17:00'}", "\"9am\" is not a time of day")]
    #[case::named_zone("{start: '09:00', end: '17:00', timeZone: Europe/Berlin}", "named zones are not supported")]
    fn bad_windows_say_why(#[case] yaml: &str, #[case] expected: &str) {
        let err = serde_saphyr::from_str::<Window>(yaml).unwrap_err().to_string();
        assert!(err.contains(expected), "{err}");
    }

    #[test]
    fn a_window_reads_back_as_written() {
        let w = window("{days: [Mon-Fri, Sun], start: '09:00', end: '17:30', timeZone: '+02:00'}");
        assert_eq!(w.to_string(), "Mon-Fri,Sun 09:00-17:30 +02:00");
        assert_eq!(serde_saphyr::from_str::<Window>(&serde_saphyr::to_string(&w).unwrap()).unwrap(), w);
    }

    #[test]
    fn a_wave_may_require_approval() {
        let wave: Wave = serde_saphyr::from_str("{name: prod, maxUnavailable: 1, approval: required}").unwrap();
        assert_eq!(wave.approval, ApprovalSetting::Required);
        assert!(!wave.is_plain());
        assert_eq!(wave.summary().as_deref(), Some("maxUnavailable 1; approval required"));
        assert_eq!(serde_saphyr::from_str::<Wave>("{name: prod}").unwrap().approval, ApprovalSetting::None);
        let err = serde_saphyr::from_str::<Wave>("{name: prod, approval: maybe}").unwrap_err().to_string();
        assert!(err.contains("unknown variant `maybe`"), "{err}");
    }
}
