//! `fleet.yaml` (kind `Fleet`): the operator's identity, the wave order, the fleet-wide desired
//! release, and rollout/status settings.

use super::{Document, Wave};
use serde::{Deserialize, Serialize};

pub type Fleet = Document<FleetSpec>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FleetSpec {
    pub operator: OperatorIdentity,
    /// Desired release of every cluster that does not pin its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// The waves in rollout order: names, or definitions that select clusters and pace the
    /// rollout ([`Wave`]; membership in [`super::wave`]).
    #[serde(with = "super::wave::entries")]
    pub waves: Vec<Wave>,
    /// How far agents trust the branch tip (the agent's own `--promotions` wins).
    #[serde(default)]
    pub promotions: PromotionMode,
    #[serde(default)]
    pub rollout: RolloutSettings,
    #[serde(default)]
    pub status: StatusSettings,
    /// The emergency brake: no cluster starts a release (or corrects drift) while set; an
    /// operation in flight (a bake, a rollback) still finishes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// Which Operator this fleet releases and where it lives in each spoke.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OperatorIdentity {
    pub name: String,
    pub namespace: String,
    /// The Operator's image repository (no tag). Releases written in the seed's ConfigMap form
    /// name only `image.tag`; their repository comes from here unless they set `image.repository`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RolloutSettings {
    /// A release halts fleet-wide once this many clusters report `failure` for it.
    #[serde(default = "default_max_failed")]
    pub max_failed_clusters: u32,
}

/// Who may decide what the fleet runs (docs/SECURITY.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromotionMode {
    /// Anyone who can push chooses which signed release each cluster runs and when; everything
    /// that could weaken safety (gate and admission policies, bake time, `maxFailedClusters`) is
    /// read from the signed release tag's own tree, and moving a cluster to an older release
    /// needs a signed decision.
    #[default]
    Unsigned,
    /// The branch tip must be a commit signed by a trusted promotion key that descends from the
    /// last tip the agent accepted; then the tip's settings are trusted.
    Signed,
}

impl FleetSpec {
    /// The wave names, in rollout order.
    pub fn wave_names(&self) -> Vec<&str> {
        self.waves.iter().map(|w| w.name.as_str()).collect()
    }

    /// The wave called `name`, with its position.
    pub fn wave(&self, name: &str) -> Option<(usize, &Wave)> {
        self.waves.iter().enumerate().find(|(_, w)| w.name == name)
    }
}

impl PromotionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PromotionMode::Unsigned => "unsigned",
            PromotionMode::Signed => "signed",
        }
    }
}

impl std::str::FromStr for PromotionMode {
    type Err = String;
    fn from_str(s: &str) -> Result<PromotionMode, String> {
        match s {
            "unsigned" => Ok(PromotionMode::Unsigned),
            "signed" => Ok(PromotionMode::Signed),
            other => Err(format!("unknown promotion mode {other:?}; expected signed or unsigned")),
        }
    }
}

fn default_max_failed() -> u32 {
    1
}

impl Default for RolloutSettings {
    fn default() -> Self {
        RolloutSettings { max_failed_clusters: default_max_failed() }
    }
}

/// Where statuses go besides Git notes (which are always written) and who hears of failures. Only
/// logical names: the forge, its token and the notification endpoints are the spoke's
/// configuration (agent flags), so nobody who can push to the repo can point an agent's
/// credentials or requests at an address of their choosing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StatusSettings {
    /// `false` keeps this fleet's statuses off the agent's forge (`--forge-*`); absent or `true`
    /// mirrors them there when the agent has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forge: Option<SpokeRef<bool>>,
    /// Which of the agent's notification endpoints (`--notify-url NAME=URL`) hears of failures and
    /// rollbacks; absent = `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<SpokeRef<String>>,
}

impl StatusSettings {
    /// Whether statuses go to the agent's forge too. The old map form is ignored, as if absent.
    pub fn forge_enabled(&self) -> bool {
        !matches!(self.forge, Some(SpokeRef::Ref(false)))
    }

    /// The agent's notification endpoint this fleet names ([`DEFAULT_ENDPOINT`] unless it names
    /// one by a valid name).
    pub fn notify_endpoint(&self) -> &str {
        self.notify.as_ref().and_then(SpokeRef::name).unwrap_or(DEFAULT_ENDPOINT)
    }
}

/// The endpoint name the repo means when it names none (`--prometheus URL`, `--notify-url URL`
/// without `NAME=` register this name).
pub const DEFAULT_ENDPOINT: &str = "default";

/// A repo setting that refers to something the spoke configures: by logical name (or on/off), or
/// in an old map form that named a URL, a token file or an environment variable itself. The old
/// form still parses, so an old repo loads, but nothing reads it; `fleetgate validate` reports it
/// and the agent records a Warning Event ([`super::FleetConfig::spoke_settings`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SpokeRef<T> {
    Ref(T),
    /// The old form, kept only to be reported.
    Legacy(serde_json::Map<String, serde_json::Value>),
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for SpokeRef<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Object(m) => Ok(SpokeRef::Legacy(m)),
            v => serde_json::from_value(v).map(SpokeRef::Ref).map_err(serde::de::Error::custom),
        }
    }
}

impl SpokeRef<String> {
    /// The name, when it is one: a DNS-1123 label. A URL written as a string is no name and is
    /// ignored like the old map form.
    pub fn name(&self) -> Option<&str> {
        match self {
            SpokeRef::Ref(n) if super::is_dns_label(n) => Some(n),
            _ => None,
        }
    }
}

impl<T> SpokeRef<T> {
    pub fn is_legacy(&self) -> bool {
        matches!(self, SpokeRef::Legacy(_))
    }
}

/// The forges fleetgate speaks to (the agent's `--forge-kind`, `promote --forge-kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForgeKind {
    Github,
    Gitea,
    Gitlab,
}

impl std::str::FromStr for ForgeKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "github" => Ok(ForgeKind::Github),
            "gitea" => Ok(ForgeKind::Gitea),
            "gitlab" => Ok(ForgeKind::Gitlab),
            other => Err(format!("unknown forge kind {other:?}; use github, gitea (also Forgejo) or gitlab")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::parse_document;
    use rstest::rstest;

    fn status(yaml: &str) -> StatusSettings {
        let text = format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: Fleet\nmetadata: {{name: f}}\nspec:\n  operator: {{name: o, namespace: o}}\n  waves: [a]\n  status: {yaml}\n"
        );
        parse_document::<FleetSpec>("fleet.yaml", &text, "Fleet").unwrap().spec.status
    }

    #[rstest]
    #[case::absent("{}", true, "default", false)]
    #[case::names("{forge: true, notify: oncall}", true, "oncall", false)]
    #[case::forge_off("{forge: false}", false, "default", false)]
    #[case::old_forge_map(
        "{forge: {kind: github, url: 'http://x', repository: a/b, tokenFile: /t}}",
        true,
        "default",
        true
    )]
    #[case::url_as_notify_name("{notify: 'https://hooks.slack.com/services/T/B/X'}", true, "default", false)]
    #[case::old_notify_map("{notify: {url: 'https://hooks.slack.com/x'}}", true, "default", true)]
    fn only_names_are_used(#[case] yaml: &str, #[case] forge: bool, #[case] notify: &str, #[case] legacy: bool) {
        let s = status(yaml);
        assert_eq!((s.forge_enabled(), s.notify_endpoint()), (forge, notify));
        let any_legacy =
            s.forge.as_ref().is_some_and(SpokeRef::is_legacy) || s.notify.as_ref().is_some_and(SpokeRef::is_legacy);
        assert_eq!(any_legacy, legacy);
    }

    #[test]
    fn a_wrong_type_is_still_an_error() {
        let text = "apiVersion: fleetgate.io/v1alpha1\nkind: Fleet\nmetadata: {name: f}\nspec:\n  operator: {name: o, namespace: o}\n  waves: [a]\n  status: {forge: [1]}\n";
        let err = parse_document::<FleetSpec>("fleet.yaml", text, "Fleet").unwrap_err().to_string();
        assert!(err.contains("boolean"), "{err}");
    }
}
