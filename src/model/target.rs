//! Which clusters a command is about — one cluster, a wave, or the fleet — and which clusters of a
//! configuration that names ([`FleetConfig::select`]). Promote, rollback, pause and wait share it.

use super::FleetConfig;
use serde::Serialize;
use std::fmt;

/// Which clusters a promotion, rollback, pause or wait is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "lowercase")]
pub enum Target {
    Cluster(String),
    Wave(String),
    Fleet,
}

impl Target {
    /// The part of a branch name that says what is promoted: `<cluster>`, `wave-<wave>`, `fleet`.
    pub fn slug(&self) -> String {
        match self {
            Target::Cluster(c) => c.clone(),
            Target::Wave(w) => format!("wave-{w}"),
            Target::Fleet => "fleet".to_string(),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Cluster(c) => write!(f, "cluster {c}"),
            Target::Wave(w) => write!(f, "wave {w}"),
            Target::Fleet => write!(f, "the fleet"),
        }
    }
}

/// A [`Target`] that names nothing in the configuration; each says what exists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("unknown cluster {name}; the fleet has: {known}")]
    UnknownCluster { name: String, known: String },
    #[error("unknown wave {name}; fleet.yaml spec.waves is: {known}")]
    UnknownWave { name: String, known: String },
    #[error("wave {0} has no clusters; add clusters/<name>.yaml with `wave: {0}` or labels its selector matches")]
    EmptyWave(String),
}

impl FleetConfig {
    /// The clusters `target` names, in wave order then name.
    pub fn select(&self, target: &Target) -> Result<Vec<String>, SelectError> {
        let mut names: Vec<String> = match target {
            Target::Cluster(c) => {
                if self.cluster(c).is_none() {
                    return Err(SelectError::UnknownCluster { name: c.clone(), known: self.known_clusters() });
                }
                vec![c.clone()]
            }
            Target::Wave(w) => {
                if self.fleet.spec.wave(w).is_none() {
                    return Err(SelectError::UnknownWave {
                        name: w.clone(),
                        known: self.fleet.spec.wave_names().join(", "),
                    });
                }
                let names: Vec<String> = self.clusters_in_wave(w).iter().map(|c| c.name().to_string()).collect();
                if names.is_empty() {
                    return Err(SelectError::EmptyWave(w.clone()));
                }
                names
            }
            Target::Fleet => self.clusters.keys().cloned().collect(),
        };
        names.sort_by_key(|n| (self.wave_position(n), n.clone()));
        Ok(names)
    }

    /// Position of cluster `name`'s wave (clusters naming an unknown wave sort last).
    pub fn wave_position(&self, name: &str) -> usize {
        self.wave_index(name).unwrap_or(self.fleet.spec.waves.len())
    }

    /// The clusters' names for a message: `a, b, c`, or how to add the first.
    pub fn known_clusters(&self) -> String {
        if self.clusters.is_empty() {
            "no clusters yet (add clusters/<name>.yaml)".to_string()
        } else {
            self.clusters.keys().cloned().collect::<Vec<_>>().join(", ")
        }
    }
}
