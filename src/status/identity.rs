//! Who wrote a status: each cluster's agent signs its entries with its own Ed25519 key, and readers
//! believe an entry only when it verifies against the key registered for that cluster
//! (`clusters/<name>.yaml` `spec.statusKey`).
//!
//! This module owns the status key types ([`StatusKey`] public, [`StatusSigner`] private), the
//! canonical form an entry is signed over ([`canonical_form`]) and the check of one entry
//! ([`StatusKeys::verify`]). The signature is an SSH signature (sshsig, the format of
//! `ssh-keygen -Y sign`) in namespace [`STATUS_NAMESPACE`], so a person can check an entry with
//! OpenSSH alone; docs/STATUS.md describes the canonical form.

use super::model::Status;
use crate::model::FleetConfig;
use serde::Serialize;
use ssh_key::{Algorithm, HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};
use std::collections::BTreeMap;
use std::fmt;

/// The sshsig namespace of status signatures: a signature made for Git (`git`) or any other use
/// never verifies as a status.
pub const STATUS_NAMESPACE: &str = "fleetgate-status";

/// First line of the canonical form; bumped with the form itself.
const CANONICAL_HEADER: &str = "fleetgate-status-v2\n";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("not an OpenSSH public key (expected `ssh-ed25519 AAAA…`): {0}")]
    PublicKey(ssh_key::Error),
    #[error("not an OpenSSH private key (expected `-----BEGIN OPENSSH PRIVATE KEY-----`): {0}")]
    PrivateKey(ssh_key::Error),
    #[error("status keys must be Ed25519 (ssh-ed25519), not {0}")]
    Algorithm(String),
    #[error("the private key is encrypted; status keys are stored unencrypted in a Secret")]
    Encrypted,
    #[error("generating a key")]
    Generate(ssh_key::Error),
    #[error("signing")]
    Sign(ssh_key::Error),
}

/// Why an entry is not believed. Each is shown next to the entry as the reason it is unverified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unverified {
    #[error("unsigned (written before status signatures, or by hand)")]
    Unsigned,
    #[error("no status key is registered for cluster {0} (clusters/{0}.yaml spec.statusKey)")]
    NoKey(String),
    #[error("the entry names cluster {named} but sits in the notes of {cluster}")]
    WrongCluster { cluster: String, named: String },
    #[error("the entry names commit {named} but is attached to {commit}")]
    WrongCommit { commit: String, named: String },
    #[error("the entry names fleet {named:?}, not {fleet}")]
    WrongFleet { fleet: String, named: Option<String> },
    #[error("signed entries carry a sequence number; this one has none")]
    NoSequence,
    #[error("the signature is not an SSH signature")]
    Malformed,
    #[error("signed by a key other than the one registered for {0}")]
    OtherKey(String),
    #[error("the signature is for namespace {0:?}, not the one of its kind ({STATUS_NAMESPACE:?} for statuses)")]
    Namespace(String),
    #[error("the signature does not match the entry (changed after signing)")]
    BadSignature,
}

/// A cluster's registered public status key: Ed25519, in OpenSSH form. The comment is dropped
/// (two registrations of one key compare equal whatever their comments).
#[derive(Clone, PartialEq, Eq)]
pub struct StatusKey(PublicKey);

impl StatusKey {
    /// Parses `ssh-ed25519 AAAA… [comment]`.
    pub fn parse(text: &str) -> Result<StatusKey, KeyError> {
        let key = PublicKey::from_openssh(text.trim()).map_err(KeyError::PublicKey)?;
        if key.algorithm() != Algorithm::Ed25519 {
            return Err(KeyError::Algorithm(key.algorithm().to_string()));
        }
        Ok(StatusKey::without_comment(key))
    }

    fn without_comment(mut key: PublicKey) -> StatusKey {
        key.set_comment("");
        StatusKey(key)
    }

    /// `ssh-ed25519 AAAA…`: the form `statusKey` holds and pins compare.
    pub fn to_openssh(&self) -> String {
        self.0.to_openssh().expect("an Ed25519 public key always encodes")
    }

    /// `SHA256:…`, as `ssh-keygen -l` prints it.
    pub fn fingerprint(&self) -> String {
        self.0.fingerprint(HashAlg::Sha256).to_string()
    }

    pub(crate) fn public_key(&self) -> &PublicKey {
        &self.0
    }
}

impl fmt::Display for StatusKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_openssh())
    }
}

impl fmt::Debug for StatusKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StatusKey({})", self.fingerprint())
    }
}

/// An agent's private status key. It never leaves the spoke: it is generated into a Secret there
/// (or supplied as a file) and only the public half is printed or registered.
#[derive(Clone)]
pub struct StatusSigner {
    key: PrivateKey,
}

impl fmt::Debug for StatusSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StatusSigner({})", self.public().fingerprint())
    }
}

impl StatusSigner {
    /// A fresh Ed25519 key from the operating system's random source.
    pub fn generate(comment: &str) -> Result<StatusSigner, KeyError> {
        let mut key =
            PrivateKey::random(&mut ssh_key::rand_core::OsRng, Algorithm::Ed25519).map_err(KeyError::Generate)?;
        key.set_comment(comment);
        Ok(StatusSigner { key })
    }

    /// Reads an unencrypted OpenSSH private key (`ssh-keygen -t ed25519 -N ''` writes one).
    pub fn from_openssh(text: &str) -> Result<StatusSigner, KeyError> {
        let key = PrivateKey::from_openssh(text.trim()).map_err(KeyError::PrivateKey)?;
        if key.is_encrypted() {
            return Err(KeyError::Encrypted);
        }
        if key.algorithm() != Algorithm::Ed25519 {
            return Err(KeyError::Algorithm(key.algorithm().to_string()));
        }
        Ok(StatusSigner { key })
    }

    /// The key in OpenSSH private key form, for the Secret that keeps it.
    pub fn to_openssh(&self) -> zeroize::Zeroizing<String> {
        self.key.to_openssh(LineEnding::LF).expect("an Ed25519 private key always encodes")
    }

    pub fn public(&self) -> StatusKey {
        StatusKey::without_comment(self.key.public_key().clone())
    }

    /// The private key itself, for the agent's SSH-signed write-back commits (namespace `git`).
    pub(crate) fn private_key(&self) -> &PrivateKey {
        &self.key
    }

    /// An armored SSH signature of `message` in `namespace`.
    pub fn sign_ssh(&self, namespace: &str, message: &[u8]) -> Result<String, KeyError> {
        let sig = self.key.sign(namespace, HashAlg::Sha512, message).map_err(KeyError::Sign)?;
        sig.to_pem(LineEnding::LF).map_err(KeyError::Sign)
    }

    /// Fills in `status`'s `fleet` and `sequence` and signs it over its canonical form.
    pub fn sign(&self, status: &mut Status, fleet: &str, sequence: u64) -> Result<(), KeyError> {
        status.fleet = Some(fleet.to_string());
        status.sequence = Some(sequence);
        status.signature = Some(self.sign_ssh(STATUS_NAMESPACE, &canonical_form(status))?);
        Ok(())
    }
}

/// The bytes a status entry is signed over: a header line, then compact JSON of the entry's
/// signed fields in a fixed order, absent optional fields as `null`. Computed from the parsed
/// values, never from the note's text, so re-serializing a note (a merge) keeps entries verifiable.
/// `extra` (fields of a newer fleetgate) and the signature itself are not covered.
pub fn canonical_form(status: &Status) -> Vec<u8> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Signed<'a> {
        fleet: &'a Option<String>,
        cluster: &'a str,
        sequence: Option<u64>,
        release: &'a str,
        commit: &'a str,
        state: &'static str,
        description: &'a str,
        gates: &'a [super::model::GateFigure],
        started_at: &'a Option<chrono::DateTime<chrono::Utc>>,
        applied_at: &'a Option<chrono::DateTime<chrono::Utc>>,
        decided_at: &'a Option<chrono::DateTime<chrono::Utc>>,
        rollback_to: &'a Option<String>,
        // Left out when absent, so entries without one keep the form older readers check.
        #[serde(skip_serializing_if = "Option::is_none")]
        approval: Option<&'a crate::model::ApprovalRecord>,
        // Like `approval`: entries of releases without variants keep their older form.
        #[serde(skip_serializing_if = "Option::is_none")]
        variant: Option<&'a str>,
        target_url: &'a Option<String>,
        agent_version: &'a str,
        reported_at: &'a chrono::DateTime<chrono::Utc>,
    }
    let signed = Signed {
        fleet: &status.fleet,
        cluster: &status.cluster,
        sequence: status.sequence,
        release: &status.release,
        commit: &status.commit,
        state: status.state.as_str(),
        description: &status.description,
        gates: &status.gates,
        started_at: &status.started_at,
        applied_at: &status.applied_at,
        decided_at: &status.decided_at,
        rollback_to: &status.rollback_to,
        approval: status.approval.as_ref(),
        variant: status.variant.as_deref(),
        target_url: &status.target_url,
        agent_version: &status.agent_version,
        reported_at: &status.reported_at,
    };
    let mut out = CANONICAL_HEADER.as_bytes().to_vec();
    out.extend(serde_json::to_vec(&signed).expect("the signed fields always serialize"));
    out
}

/// What an agent writes statuses as: its key and its fleet.
#[derive(Debug, Clone)]
pub struct StatusIdentity {
    pub fleet: String,
    pub signer: StatusSigner,
}

impl StatusIdentity {
    pub fn new(fleet: impl Into<String>, signer: StatusSigner) -> StatusIdentity {
        StatusIdentity { fleet: fleet.into(), signer }
    }

    /// Keys that believe exactly this identity as `cluster`.
    pub fn keys_for(&self, cluster: &str) -> StatusKeys {
        let mut keys = StatusKeys::new(&self.fleet);
        keys.insert(cluster, self.signer.public());
        keys
    }
}

/// The keys readers verify statuses with, by cluster, and the fleet every entry must name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusKeys {
    fleet: String,
    by_cluster: BTreeMap<String, StatusKey>,
}

impl StatusKeys {
    pub fn new(fleet: impl Into<String>) -> StatusKeys {
        StatusKeys { fleet: fleet.into(), by_cluster: BTreeMap::new() }
    }

    /// The keys the configuration registers (`spec.statusKey` of each cluster), for its fleet.
    pub fn registered(config: &FleetConfig) -> StatusKeys {
        StatusKeys::from_openssh(config.fleet.name(), &StatusKeys::registrations(config))
    }

    /// Each cluster's registered key in the comment-less OpenSSH form pins compare. A key that
    /// does not parse registers nothing (`fleetgate validate` reports it), so that cluster's
    /// entries read as unverified.
    pub fn registrations(config: &FleetConfig) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for cluster in config.clusters.values() {
            let Some(text) = &cluster.spec.status_key else { continue };
            match StatusKey::parse(text) {
                Ok(key) => {
                    out.insert(cluster.name().to_string(), key.to_openssh());
                }
                Err(e) => tracing::warn!(cluster = cluster.name(), error = %e, "ignoring an unreadable statusKey"),
            }
        }
        out
    }

    /// Keys from `cluster → ssh-ed25519 AAAA…` (an agent's pins); entries that do not parse are skipped.
    pub fn from_openssh(fleet: &str, keys: &BTreeMap<String, String>) -> StatusKeys {
        let mut out = StatusKeys::new(fleet);
        for (cluster, text) in keys {
            if let Ok(key) = StatusKey::parse(text) {
                out.insert(cluster, key);
            }
        }
        out
    }

    pub fn insert(&mut self, cluster: &str, key: StatusKey) {
        self.by_cluster.insert(cluster.to_string(), key);
    }

    pub fn fleet(&self) -> &str {
        &self.fleet
    }

    pub fn get(&self, cluster: &str) -> Option<&StatusKey> {
        self.by_cluster.get(cluster)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &StatusKey)> {
        self.by_cluster.iter().map(|(c, k)| (c.as_str(), k))
    }

    /// Whether `entry`, found in `cluster`'s notes on `commit`, was written by that cluster's agent
    /// for this fleet and not changed since.
    pub fn verify(&self, cluster: &str, commit: &str, entry: &Status) -> Result<(), Unverified> {
        let Some(armored) = &entry.signature else { return Err(Unverified::Unsigned) };
        if entry.cluster != cluster {
            return Err(Unverified::WrongCluster { cluster: cluster.to_string(), named: entry.cluster.clone() });
        }
        if !entry.commit.eq_ignore_ascii_case(commit) {
            return Err(Unverified::WrongCommit { commit: commit.to_string(), named: entry.commit.clone() });
        }
        if entry.fleet.as_deref() != Some(self.fleet.as_str()) {
            return Err(Unverified::WrongFleet { fleet: self.fleet.clone(), named: entry.fleet.clone() });
        }
        if entry.sequence.is_none() {
            return Err(Unverified::NoSequence);
        }
        self.verify_signed(cluster, STATUS_NAMESPACE, &canonical_form(entry), armored)
    }

    /// Whether `armored` is `cluster`'s registered key's signature of `message` in `namespace`
    /// (the check statuses and heartbeats share; the caller checks what the message names).
    pub(super) fn verify_signed(
        &self,
        cluster: &str,
        namespace: &str,
        message: &[u8],
        armored: &str,
    ) -> Result<(), Unverified> {
        let key = self.get(cluster).ok_or_else(|| Unverified::NoKey(cluster.to_string()))?;
        verify_ssh(key.public_key(), namespace, message, armored).map_err(|e| e.for_cluster(cluster))
    }
}

/// Why one SSH signature does not verify (the shared check of status entries).
enum SshProblem {
    Malformed,
    OtherKey,
    Namespace(String),
    Bad,
}

impl SshProblem {
    fn for_cluster(self, cluster: &str) -> Unverified {
        match self {
            SshProblem::Malformed => Unverified::Malformed,
            SshProblem::OtherKey => Unverified::OtherKey(cluster.to_string()),
            SshProblem::Namespace(ns) => Unverified::Namespace(ns),
            SshProblem::Bad => Unverified::BadSignature,
        }
    }
}

fn verify_ssh(key: &PublicKey, namespace: &str, message: &[u8], armored: &str) -> Result<(), SshProblem> {
    let sig = SshSig::from_pem(armored.trim()).map_err(|_| SshProblem::Malformed)?;
    if sig.public_key() != key.key_data() {
        return Err(SshProblem::OtherKey);
    }
    if sig.namespace() != namespace {
        return Err(SshProblem::Namespace(sig.namespace().to_string()));
    }
    key.verify(namespace, message, &sig).map_err(|_| SshProblem::Bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::State;

    const COMMIT: &str = "4f3c9a0d6e1b2c3d4e5f60718293a4b5c6d7e8f9";

    fn signed(signer: &StatusSigner, sequence: u64) -> Status {
        let mut s = Status::new("cluster-a", "rel-9", COMMIT, State::Success, "all gates passed");
        signer.sign(&mut s, "redis-fleet", sequence).unwrap();
        s
    }

    fn keys(signer: &StatusSigner) -> StatusKeys {
        let mut keys = StatusKeys::new("redis-fleet");
        keys.insert("cluster-a", signer.public());
        keys
    }

    #[test]
    fn a_signed_entry_verifies_and_survives_a_json_round_trip() {
        let signer = StatusSigner::generate("cluster-a").unwrap();
        let entry = signed(&signer, 7);
        let text = serde_json::to_string_pretty(&entry).unwrap();
        let again: Status = serde_json::from_str(&text).unwrap();
        assert_eq!(keys(&signer).verify("cluster-a", COMMIT, &again), Ok(()));
    }

    #[test]
    fn every_signed_field_is_covered() {
        let signer = StatusSigner::generate("cluster-a").unwrap();
        let keys = keys(&signer);
        let changes: Vec<(&str, Box<dyn Fn(&mut Status)>)> = vec![
            ("state", Box::new(|s| s.state = State::Failure)),
            ("description", Box::new(|s| s.description.push('!'))),
            ("release", Box::new(|s| s.release = "rel-8".into())),
            ("sequence", Box::new(|s| s.sequence = Some(99))),
            ("reportedAt", Box::new(|s| s.reported_at = "2099-01-01T00:00:00Z".parse().unwrap())),
            ("rollbackTo", Box::new(|s| s.rollback_to = Some("rel-1".into()))),
            (
                "gates",
                Box::new(|s| {
                    s.gates.push(crate::status::GateFigure {
                        name: "g".into(),
                        observed: "1".into(),
                        threshold: "2".into(),
                        verdict: "pass".into(),
                    })
                }),
            ),
        ];
        for (field, change) in changes {
            let mut entry = signed(&signer, 1);
            change(&mut entry);
            assert_eq!(keys.verify("cluster-a", COMMIT, &entry), Err(Unverified::BadSignature), "{field}");
        }
    }

    #[test]
    fn each_way_of_being_unverified_has_its_own_reason() {
        let a = StatusSigner::generate("cluster-a").unwrap();
        let b = StatusSigner::generate("cluster-b").unwrap();
        let keys = keys(&a);
        let mut unsigned = Status::new("cluster-a", "rel-9", COMMIT, State::Success, "ok");
        assert_eq!(keys.verify("cluster-a", COMMIT, &unsigned), Err(Unverified::Unsigned));
        unsigned.signature = Some("garbage".into());
        unsigned.fleet = Some("redis-fleet".into());
        unsigned.sequence = Some(1);
        assert_eq!(keys.verify("cluster-a", COMMIT, &unsigned), Err(Unverified::Malformed));
        assert_eq!(keys.verify("cluster-a", COMMIT, &signed(&b, 1)), Err(Unverified::OtherKey("cluster-a".into())));
        assert!(matches!(keys.verify("cluster-b", COMMIT, &signed(&a, 1)), Err(Unverified::WrongCluster { .. })));
        assert!(matches!(
            keys.verify("cluster-a", &"0".repeat(40), &signed(&a, 1)),
            Err(Unverified::WrongCommit { .. })
        ));
        assert!(matches!(
            StatusKeys::new("other-fleet").verify("cluster-a", COMMIT, &signed(&a, 1)),
            Err(Unverified::WrongFleet { .. })
        ));
        assert_eq!(
            StatusKeys::new("redis-fleet").verify("cluster-a", COMMIT, &signed(&a, 1)),
            Err(Unverified::NoKey("cluster-a".into()))
        );
        let mut other_ns = signed(&a, 1);
        other_ns.signature = Some(a.sign_ssh("git", &canonical_form(&other_ns)).unwrap());
        assert_eq!(keys.verify("cluster-a", COMMIT, &other_ns), Err(Unverified::Namespace("git".into())));
    }

    #[test]
    fn keys_round_trip_in_openssh_form_and_refuse_other_algorithms() {
        let signer = StatusSigner::generate("c").unwrap();
        let again = StatusSigner::from_openssh(&signer.to_openssh()).unwrap();
        assert_eq!(again.public(), signer.public());
        let public = StatusKey::parse(&format!("{} some comment", signer.public())).unwrap();
        assert_eq!(public, signer.public());
        assert!(public.to_openssh().starts_with("ssh-ed25519 AAAA"));
        assert!(StatusKey::parse("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQC").is_err());
        assert!(StatusKey::parse("not a key").is_err());
    }
}
