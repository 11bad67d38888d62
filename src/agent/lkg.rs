//! The last-known-good store: the signed Git objects of the releases that succeeded here, kept
//! in the spoke, so a rollback never needs the Git server or the tag (a deleted tag, a pruned
//! mirror, a Git server out of reach during the bake).
//!
//! What is kept: a **bundle** of raw Git objects — the release's signed tag object, its commit,
//! and every tree and blob of the commit's tree (`release.yaml`, the manifests, the fleet
//! configuration the release's policies come from). Nothing in it is trusted as stored. Using
//! it ([`Agent::last_known_good`]) means:
//! 1. the bundle's SHA-256 equals the name it is stored under (content-addressed), and its
//!    HMAC-SHA256 under the agent key ([`crate::apply::AgentKey`]) verifies;
//! 2. every object, written into a throw-away bare repository, hashes to the object id it is
//!    listed under — so the tag → commit → tree → blob chain is the one the signature covers;
//! 3. the release is verified from that repository exactly as from the mirror
//!    ([`release::verify`]): the tag's signature against the agent's trusted keys, the tag pin
//!    recorded when the release first ran, the mapping against the manifests.
//!
//! Any failure is [`LkgError::Tampered`] / [`LkgError::Refused`]; nothing from the bundle is
//! applied then.
//!
//! Storage: Secrets in the agent's namespace (the Role deploy/ ships already grants `secrets`
//! get, list, create, delete there for snapshots; the store needs no other verb), chunks
//! `<inventory>-lkg-<sha256>-<n>` of at most [`crate::apply::CHUNK_BYTES`] (a real Operator's ~1 MB CRDs span
//! a few), then the index `<inventory>-lkg-<sha256>` written last, labelled with the release. A
//! release is stored when it succeeds; the newest [`LKG_HISTORY`] are kept.

use super::reconcile::{Agent, ReconcileError};
use crate::apply::{ApplyError, ChunkError, Existing, LABEL_INVENTORY, LABEL_RELEASE, read_chunks, write_chunks};
use crate::model::error_chain;
use crate::release::{self, VerifiedRelease, VerifyError};
use crate::source::{Checkout, SourceError};
use git2::{ObjectType, Oid, Repository};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// Releases kept in the store (the current last-known-good and the ones before it).
pub const LKG_HISTORY: usize = 3;
/// Label (value `true`) marking an index Secret of the store.
const LABEL_LKG: &str = "fleetgate.io/lkg";
/// Label on an index and its chunks: the first 32 hex digits of the bundle's SHA-256.
const LABEL_BUNDLE: &str = "fleetgate.io/lkg-bundle";
const ANN_CHUNKS: &str = "fleetgate.io/lkg-chunks";
const ANN_MAC: &str = "fleetgate.io/lkg-hmac-sha256";
const ANN_CREATED: &str = "fleetgate.io/lkg-created";
const DATA_KEY: &str = "bundle";
const MAC_DOMAIN: &str = "fleetgate last-known-good v1";
const MAGIC: &str = "fleetgate-lkg v1";
/// The branch the throw-away repository's checkout tracks (points at the release commit).
const BRANCH: &str = "lkg";

#[derive(Debug, thiserror::Error)]
pub enum LkgError {
    #[error("the last-known-good store holds no copy of release {release}")]
    Missing { release: String },
    #[error(
        "the stored copy {name} of release {release} is tampered with or damaged: {reason}; refusing to use it (delete it; the next success stores a new one)"
    )]
    Tampered { release: String, name: String, reason: String },
    #[error("the stored copy {name} of release {release} does not verify; refusing to use it")]
    Refused {
        release: String,
        name: String,
        #[source]
        source: Box<VerifyError>,
    },
    #[error("reading the release's Git objects")]
    Git(#[from] git2::Error),
    #[error("a throw-away repository for the stored copy")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Api(#[from] ApplyError),
    #[error(transparent)]
    State(#[from] super::state::StateError),
}

impl LkgError {
    pub fn class(&self) -> crate::model::ErrorClass {
        match self {
            LkgError::Tampered { .. } | LkgError::Refused { .. } => crate::model::ErrorClass::Stalling,
            LkgError::Api(e) => e.class(),
            _ => crate::model::ErrorClass::Retryable,
        }
    }
}

/// One stored release, as its index says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stored {
    name: String,
    release: String,
    created: String,
    chunks: usize,
    mac: String,
}

/// The raw objects of a release: its tag, its commit, every tree and blob of the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bundle {
    release: String,
    tag: Oid,
    commit: Oid,
    objects: Vec<(ObjectType, Oid, Vec<u8>)>,
}

impl Bundle {
    /// Reads release `id`'s objects out of `repo`.
    fn collect(repo: &Repository, id: &str, tag: Oid, commit: Oid) -> Result<Bundle, git2::Error> {
        let odb = repo.odb()?;
        let mut objects = Vec::new();
        let mut seen = BTreeSet::new();
        let mut push = |oid: Oid, objects: &mut Vec<_>| -> Result<bool, git2::Error> {
            if !seen.insert(oid) {
                return Ok(false);
            }
            let o = odb.read(oid)?;
            objects.push((o.kind(), oid, o.data().to_vec()));
            Ok(true)
        };
        push(tag, &mut objects)?;
        push(commit, &mut objects)?;
        let mut trees = vec![repo.find_commit(commit)?.tree_id()];
        while let Some(tree) = trees.pop() {
            if !push(tree, &mut objects)? {
                continue;
            }
            for entry in repo.find_tree(tree)?.iter() {
                match entry.kind() {
                    Some(ObjectType::Tree) => trees.push(entry.id()),
                    Some(ObjectType::Blob) => {
                        push(entry.id(), &mut objects)?;
                    }
                    // Submodule commits are not part of what a release reads.
                    _ => {}
                }
            }
        }
        Ok(Bundle { release: id.to_string(), tag, commit, objects })
    }

    fn encode(&self) -> Vec<u8> {
        let mut out =
            format!("{MAGIC}\nrelease {}\ntag {}\ncommit {}\n", self.release, self.tag, self.commit).into_bytes();
        for (kind, oid, data) in &self.objects {
            out.extend_from_slice(format!("{kind} {oid} {}\n", data.len()).as_bytes());
            out.extend_from_slice(data);
        }
        out
    }

    fn decode(bytes: &[u8]) -> Result<Bundle, String> {
        let mut rest = bytes;
        let mut line = || -> Result<String, String> {
            let end = rest.iter().position(|&b| b == b'\n').ok_or("truncated header")?;
            let text = std::str::from_utf8(&rest[..end]).map_err(|_| "a header line is not UTF-8")?.to_string();
            rest = &rest[end + 1..];
            Ok(text)
        };
        if line()? != MAGIC {
            return Err(format!("it does not start with {MAGIC:?}"));
        }
        let field = |text: String, name: &str| {
            text.strip_prefix(&format!("{name} ")).map(str::to_string).ok_or_else(|| format!("no {name} line"))
        };
        let oid = |hex: String| Oid::from_str(&hex).map_err(|_| format!("{hex:?} is not an object id"));
        let release = field(line()?, "release")?;
        let tag = oid(field(line()?, "tag")?)?;
        let commit = oid(field(line()?, "commit")?)?;
        let mut objects = Vec::new();
        while !rest.is_empty() {
            let end = rest.iter().position(|&b| b == b'\n').ok_or("truncated object header")?;
            let header = std::str::from_utf8(&rest[..end]).map_err(|_| "an object header is not UTF-8")?;
            let mut parts = header.split(' ');
            let (Some(kind), Some(id), Some(len), None) = (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(format!("bad object header {header:?}"));
            };
            let kind = ObjectType::from_str(kind).ok_or_else(|| format!("unknown object kind {kind:?}"))?;
            let id = oid(id.to_string())?;
            let len: usize = len.parse().map_err(|_| format!("bad object length {len:?}"))?;
            let data = rest.get(end + 1..end + 1 + len).ok_or("truncated object")?;
            objects.push((kind, id, data.to_vec()));
            rest = &rest[end + 1 + len..];
        }
        Ok(Bundle { release, tag, commit, objects })
    }

    /// Writes every object into a new bare repository at `dir` — refusing any whose content does
    /// not hash to its listed id — with the tag under `refs/tags/<release>` and the commit as
    /// branch [`BRANCH`].
    fn unpack(&self, dir: &std::path::Path) -> Result<Checkout, String> {
        let repo = Repository::init_bare(dir).map_err(|e| e.to_string())?;
        let odb = repo.odb().map_err(|e| e.to_string())?;
        for (kind, oid, data) in &self.objects {
            let written = odb.write(*kind, data).map_err(|e| e.to_string())?;
            if written != *oid {
                return Err(format!("object {oid} hashes to {written}"));
            }
        }
        let missing = |what: &str, oid: Oid| format!("the {what} {oid} is not in the bundle");
        let tag_kind = odb.read_header(self.tag).map_err(|_| missing("tag", self.tag))?.1;
        if tag_kind != ObjectType::Tag {
            return Err(format!("{} is a {tag_kind}, not a tag object", self.tag));
        }
        repo.reference(&format!("refs/tags/{}", self.release), self.tag, true, "last-known-good")
            .map_err(|e| e.to_string())?;
        repo.reference(&format!("refs/heads/{BRANCH}"), self.commit, true, "last-known-good")
            .map_err(|_| missing("commit", self.commit))?;
        // Every tree and blob the commit names must be here: the manifests are read from them.
        let commit = repo.find_commit(self.commit).map_err(|_| missing("commit", self.commit))?;
        let mut incomplete = None;
        commit
            .tree()
            .map_err(|_| missing("tree", commit.tree_id()))?
            .walk(git2::TreeWalkMode::PreOrder, |_, entry| {
                if entry.kind() == Some(ObjectType::Blob) && odb.read_header(entry.id()).is_err() {
                    incomplete = Some(entry.id());
                    return git2::TreeWalkResult::Abort;
                }
                git2::TreeWalkResult::Ok
            })
            .ok();
        if let Some(blob) = incomplete {
            return Err(missing("blob", blob));
        }
        Checkout::open_local(dir, Some(BRANCH)).map_err(|e| error_chain(&e))
    }
}

/// Of the stored releases (newest first), those beyond the newest [`LKG_HISTORY`], except `keep`.
fn superseded(stored: Vec<Stored>, keep: &str) -> Vec<Stored> {
    stored.into_iter().skip(LKG_HISTORY).filter(|s| s.release != keep).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

impl Agent {
    fn lkg_secrets(&self) -> Api<Secret> {
        Api::namespaced(self.services.client.clone(), &self.engine.options().agent_namespace)
    }

    fn lkg_prefix(&self) -> String {
        format!("{}-lkg-", self.engine.options().inventory)
    }

    /// Stores release `id` (just succeeded, its tag in `checkout`) as last-known-good and trims
    /// the store. A failure is a Warning Event, never a failed pass: the release did succeed,
    /// and a rollback can still fall back to the tag in the mirror.
    pub(super) async fn keep_last_known_good(&self, checkout: &Checkout, id: &str) {
        if let Err(e) = self.store_last_known_good(checkout, id).await {
            let message = format!("release {id} succeeded but was not stored as last-known-good: {}", error_chain(&e));
            tracing::warn!(release = %id, "{message}");
            self.services.record_warning("LastKnownGoodNotStored", "Store", &message).await;
        }
    }

    async fn store_last_known_good(&self, checkout: &Checkout, id: &str) -> Result<(), LkgError> {
        let tag = checkout.tag(id)?.ok_or_else(|| LkgError::Missing { release: id.to_string() })?;
        let object = tag.object.ok_or_else(|| LkgError::Missing { release: id.to_string() })?;
        let bundle = tokio::task::block_in_place(|| Bundle::collect(checkout.repo(), id, object, tag.commit))?;
        let bytes = bundle.encode();
        let sha = sha256_hex(&bytes);
        let name = format!("{}{sha}", self.lkg_prefix());
        let api = self.lkg_secrets();
        let stored = |e| LkgError::Api(crate::apply::ApplyError::Kube { action: format!("storing {name}"), source: e });
        if api.get_opt(&name).await.map_err(stored)?.is_none() {
            let key = self.engine.agent_key().await?;
            let labels = |extra: &[(&str, &str)]| {
                let mut l = BTreeMap::from([
                    (crate::apply::LABEL_MANAGED_BY.to_string(), crate::FIELD_MANAGER.to_string()),
                    (LABEL_INVENTORY.to_string(), self.engine.options().inventory.clone()),
                    (LABEL_BUNDLE.to_string(), sha[..32].to_string()),
                ]);
                l.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
                l
            };
            // Content-addressed: a chunk left by an interrupted store is the same bytes.
            let chunks =
                write_chunks(&api, &name, DATA_KEY, &bytes, &labels(&[]), Existing::Keep).await.map_err(stored)?;
            let created = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let index = Secret {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(labels(&[(LABEL_LKG, "true"), (LABEL_RELEASE, id)])),
                    annotations: Some(BTreeMap::from([
                        (ANN_CHUNKS.to_string(), chunks.to_string()),
                        (ANN_MAC.to_string(), key.mac(MAC_DOMAIN, &[id.as_bytes(), sha.as_bytes()])),
                        (ANN_CREATED.to_string(), created),
                    ])),
                    ..Default::default()
                },
                ..Default::default()
            };
            api.create(&PostParams::default(), &index).await.map_err(stored)?;
            tracing::info!(release = %id, name = %name, chunks, bytes = bytes.len(), "stored as last-known-good");
        }
        self.trim_last_known_good(id).await
    }

    /// The stored releases, newest first.
    async fn stored_last_known_good(&self, release: Option<&str>) -> Result<Vec<Stored>, LkgError> {
        let mut selector = format!("{LABEL_INVENTORY}={},{LABEL_LKG}=true", self.engine.options().inventory);
        if let Some(r) = release {
            selector.push_str(&format!(",{LABEL_RELEASE}={r}"));
        }
        let list = self.lkg_secrets().list_metadata(&ListParams::default().labels(&selector)).await.map_err(|e| {
            LkgError::Api(crate::apply::ApplyError::Kube {
                action: "listing the last-known-good store".into(),
                source: e,
            })
        })?;
        let mut out: Vec<Stored> = list
            .items
            .into_iter()
            .filter_map(|s| {
                let ann = s.metadata.annotations?;
                Some(Stored {
                    name: s.metadata.name?,
                    release: s.metadata.labels?.get(LABEL_RELEASE)?.clone(),
                    created: ann.get(ANN_CREATED).cloned().unwrap_or_default(),
                    chunks: ann.get(ANN_CHUNKS)?.parse().ok()?,
                    mac: ann.get(ANN_MAC).cloned().unwrap_or_default(),
                })
            })
            .collect();
        out.sort_by(|a, b| b.created.cmp(&a.created));
        Ok(out)
    }

    /// Deletes stored releases beyond the newest [`LKG_HISTORY`] (never `keep`), each index
    /// first so no half-deleted copy is ever listed.
    async fn trim_last_known_good(&self, keep: &str) -> Result<(), LkgError> {
        let api = self.lkg_secrets();
        let prefix = self.lkg_prefix();
        for s in superseded(self.stored_last_known_good(None).await?, keep) {
            let gone =
                |e| LkgError::Api(crate::apply::ApplyError::Kube { action: format!("deleting {}", s.name), source: e });
            api.delete(&s.name, &DeleteParams::default()).await.map_err(gone)?;
            let sha = s.name.strip_prefix(&prefix).unwrap_or_default();
            let chunks = format!(
                "{LABEL_INVENTORY}={},{LABEL_BUNDLE}={}",
                self.engine.options().inventory,
                sha.get(..32).unwrap_or(sha)
            );
            api.delete_collection(&DeleteParams::default(), &ListParams::default().labels(&chunks))
                .await
                .map_err(gone)?;
        }
        Ok(())
    }

    /// Release `id` from the store, verified again (see the module docs).
    ///
    /// # Errors
    /// [`LkgError::Missing`] when no copy is stored; [`LkgError::Tampered`] when its bytes are not
    /// what the agent stored; [`LkgError::Refused`] when they do not verify as a release.
    pub(super) async fn last_known_good(&self, id: &str) -> Result<VerifiedRelease, LkgError> {
        let stored = self.stored_last_known_good(Some(id)).await?;
        let newest = stored.into_iter().next().ok_or_else(|| LkgError::Missing { release: id.to_string() })?;
        let tampered =
            |reason: String| LkgError::Tampered { release: id.to_string(), name: newest.name.clone(), reason };
        let api = self.lkg_secrets();
        let bytes = read_chunks(&api, &newest.name, DATA_KEY, newest.chunks).await.map_err(|e| match e {
            ChunkError::Missing(name) => tampered(format!("chunk {name} is missing or empty")),
            ChunkError::Api { name, source } => {
                LkgError::Api(crate::apply::ApplyError::Kube { action: format!("reading {name}"), source })
            }
        })?;
        let sha = sha256_hex(&bytes);
        if newest.name != format!("{}{sha}", self.lkg_prefix()) {
            return Err(tampered(format!("its content hashes to {sha}, not to the name it is stored under")));
        }
        let key = self.engine.agent_key().await?;
        if !key.verify(MAC_DOMAIN, &[id.as_bytes(), sha.as_bytes()], &newest.mac) {
            return Err(tampered("its HMAC does not verify under the agent key".into()));
        }
        let bundle = Bundle::decode(&bytes).map_err(&tampered)?;
        if bundle.release != id {
            return Err(tampered(format!("it holds release {}", bundle.release)));
        }
        let state = self.services.store.load().await?;
        let mut pins = state.tag_pins().clone();
        let dir = tempfile::Builder::new().prefix("fleetgate-lkg").tempdir()?;
        let refused =
            |source| LkgError::Refused { release: id.to_string(), name: newest.name.clone(), source: Box::new(source) };
        tokio::task::block_in_place(|| {
            let checkout = bundle.unpack(dir.path()).map_err(&tampered)?;
            let desired = release::resolve_release(&checkout, &self.services.config.cluster, id)
                .map_err(|e| tampered(error_chain(&e)))?;
            // Held to the fleet the state pinned, not the bundle's own fleet.yaml.
            release::verify(&checkout, &desired, &self.keyring, self.pinned_fleet(&state), &mut pins).map_err(refused)
        })
    }

    /// The rollback target, verified: from the last-known-good store, else from its tag in the
    /// mirror — a release stored before this agent kept copies, or a stored copy that was
    /// refused (a Warning Event says so; when the tag is gone too, the refusal is the error).
    pub(super) async fn rollback_release(
        &self,
        checkout: &Checkout,
        id: &str,
    ) -> Result<VerifiedRelease, ReconcileError> {
        let refused = match self.last_known_good(id).await {
            Ok(verified) => {
                tracing::info!(release = %id, "rollback target read from the last-known-good store");
                return self.for_this_cluster(verified).await?.or_error();
            }
            Err(LkgError::Missing { .. }) => {
                tracing::info!(release = %id, "no stored copy of the rollback target; reading its tag");
                return self.verify_known(checkout, id).await;
            }
            Err(e @ (LkgError::Tampered { .. } | LkgError::Refused { .. })) => e,
            Err(e) => return Err(e.into()),
        };
        let note = format!("{}; reading {id} from its tag instead", error_chain(&refused));
        tracing::warn!(release = %id, "{note}");
        self.services.record_warning("LastKnownGoodRefused", "RollingBack", &note).await;
        match self.verify_known(checkout, id).await {
            Err(ReconcileError::Resolve(release::ResolveError::TagNotFound { .. })) => Err(refused.into()),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Bundle {
        let oid = |s: &str| Oid::from_str(s).unwrap();
        Bundle {
            release: "rel-1".into(),
            tag: oid("1111111111111111111111111111111111111111"),
            commit: oid("2222222222222222222222222222222222222222"),
            objects: vec![
                (ObjectType::Blob, oid("3333333333333333333333333333333333333333"), b"a\nb\n".to_vec()),
                (ObjectType::Tree, oid("4444444444444444444444444444444444444444"), vec![0, 1, b'\n', 2]),
            ],
        }
    }

    #[test]
    fn only_the_newest_few_are_kept_and_never_the_current_one() {
        let stored = |release: &str, created: &str| Stored {
            name: format!("fleetgate-a-lkg-{release}"),
            release: release.into(),
            created: created.into(),
            chunks: 1,
            mac: String::new(),
        };
        // Newest first; rel-1 succeeded again (a rollback target) but its copy is the oldest.
        let all = vec![
            stored("rel-5", "5"),
            stored("rel-4", "4"),
            stored("rel-3", "3"),
            stored("rel-2", "2"),
            stored("rel-1", "1"),
        ];
        let gone: Vec<String> = superseded(all.clone(), "rel-5").into_iter().map(|s| s.release).collect();
        assert_eq!(gone, ["rel-2", "rel-1"]);
        let gone: Vec<String> = superseded(all, "rel-1").into_iter().map(|s| s.release).collect();
        assert_eq!(gone, ["rel-2"]);
    }

    #[test]
    fn a_bundle_decodes_to_what_was_encoded() {
        assert_eq!(Bundle::decode(&sample().encode()).unwrap(), sample());
    }

    #[test]
    fn truncated_or_foreign_bytes_do_not_decode() {
        let bytes = sample().encode();
        assert!(Bundle::decode(&bytes[..bytes.len() - 1]).unwrap_err().contains("truncated"));
        assert!(Bundle::decode(b"PK\x03\x04").is_err());
    }

    #[test]
    fn an_object_whose_content_changed_is_refused_when_unpacked() {
        let repo_dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(repo_dir.path()).unwrap();
        let blob = repo.blob(b"kind: ConfigMap\n").unwrap();
        let mut bundle = sample();
        bundle.objects = vec![(ObjectType::Blob, blob, b"kind: ClusterRoleBinding\n".to_vec())];
        let out = tempfile::tempdir().unwrap();
        let err = bundle.unpack(&out.path().join("r")).unwrap_err();
        assert!(err.contains(&format!("object {blob} hashes to")), "{err}");
    }
}
