//! Server-side apply of a verified release in phases, inventory and prune, snapshots and restore,
//! drift.
//!
//! The agent drives an [`Engine`] in this order (each step its own call, so the agent can persist
//! its progress between them and resume after a restart):
//!
//! ```text
//! snapshot()            store release N's live objects + every CR of N's CRDs (in-cluster Secrets)
//! admit(N+1, policy)    manifests (discovery, parse, CRDs typed) → admission policy → AdmittedSet
//! apply(admitted)       objects it would not change left alone (below)
//!                       → server-side dry run of the rest (all or nothing) → adoption check (below)
//!                       → inventory (N+1's objects, N's leftovers marked for prune)
//!                       → phases: Namespaces → CRDs (Established, discovery refreshed)
//!                         → RBAC → config → workloads (rollout, optional) → other/CRs → webhooks
//!                       → inventory records (what was sent, what the server stored)
//!                       → ConfigMap release-manifest-<id>
//! prune()               delete what N had and N+1 dropped (CRDs only when allowed)
//! ── before, changing nothing ──
//! dry_run(admitted)     the dry run and adoption check of apply() alone (the pre-apply gate)
//! changes(admitted, d)  what apply() and prune() would do to each object (spoke plans)
//! ── on failure ──
//! apply(admit(N)) ; prune() ; restore(snapshot)      CR state back, not just the image
//! ```
//!
//! [`AgentRbac`] is the least-privilege RBAC applying a release needs (`fleetgate agent rbac`).
//!
//! Every object fleetgate applies carries the labels [`LABEL_MANAGED_BY`] and [`LABEL_INVENTORY`],
//! which stay the same from release to release; which release an object belongs to is the
//! inventory ConfigMap's record (in the agent's namespace), which prune and snapshot read. So a
//! new release writes only the objects it changes: an object whose content and live state are
//! what fleetgate last applied (inventory records, see `unchanged`) is neither dry-run nor
//! applied, and the snapshot before a release leaves it out.
//!
//! [`Engine::drift`] compares live objects with a release without changing anything; calling
//! [`Engine::apply`] again corrects drift (a drifted object is never left alone, and server-side
//! apply with `force` takes every field of the release back).
//!
//! Adoption: a forced server-side apply takes over any live object of the same name. An object
//! that exists but that fleetgate did not apply (not in the inventory, not carrying its
//! inventory label) is refused before anything is applied, by [`dry_run`](Engine::dry_run) and
//! [`apply`](Engine::apply) alike, unless the release's object carries
//! `fleetgate.io/adopt: "true"` or every policy says `adopt: true`. Adopted objects are recorded
//! as such in the inventory, and prune never deletes them: fleetgate did not create them.
//!
//! Dry run limits: the server refuses to dry-run an object in a namespace that does not exist,
//! and can only check a custom resource against the schema its CRD has *now*. So objects in a
//! namespace the release creates are dry-run right after the Namespaces phase, and custom
//! resources of a CRD the release creates or changes right after the CRD phase (Flux's
//! kustomize-controller stages Namespaces and CRDs the same way). If one of those late dry runs
//! fails, the apply stops with only the release's Namespaces (and CRDs) applied, before any
//! workload changed; the [`ChangeSet`] names the deferred objects. Everything else — custom
//! resources of unchanged CRDs included — is dry-run before anything is applied.

mod changes;
mod chunked;
mod drift;
mod fields;
mod inventory;
mod offline;
mod phases;
mod prune;
mod rbac;
mod rollout;
mod snapshot;
mod unchanged;
mod withdraw;

pub use changes::{Action, ChangeSet, DeferredDryRun, ObjectChange, ObjectFailure};
pub use chunked::CHUNK_BYTES;
pub(crate) use chunked::{ChunkError, Existing, read_chunks, write_chunks};
pub use drift::{DriftInput, DriftInputError, DriftRelease, DriftReport, DriftState, ObjectDrift, compare};
pub use inventory::{Inventory, InventoryEntry, inventory_name, release_manifest_name};
pub use offline::{admission_offline, roles_judged_live};
pub use rbac::{AgentRbac, Grant, RbacError, builtin_scope, release_rbac, yaml_grants};
pub use snapshot::{AgentKey, AgentKeyError, LABEL_SNAPSHOT, SnapshotInfo};
pub use unchanged::{AppliedRecord, SealedRecords};

use crate::manifests::admission::{self, AdmissionError, AdmissionPolicy, LiveApi};
use crate::manifests::{CrdNames, Manifest, ManifestError, ManifestSet, ObjectKey, Phase};
use crate::model::{ErrorClass, is_label_value};
use crate::release::VerifiedRelease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::DynamicObject;
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The release a snapshot or a last-known-good record holds, on those Secrets. Applied objects do
/// not carry it: a release label on every object would make every release rewrite every object.
pub const LABEL_RELEASE: &str = "fleetgate.io/release";
/// Standard "who manages this" label; always `fleetgate`.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// What fleetgate's own installation made (deploy/, `fleetgate agent rbac`): value `fleetgate`.
/// A Namespace carrying it was made for a release to land in ([`made_for_fleetgate`]).
pub const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";

/// Which inventory (one per agent installation) an object belongs to. Prune only ever deletes
/// objects that still carry this label with the engine's inventory id.
pub const LABEL_INVENTORY: &str = "fleetgate.io/inventory";

/// How the engine behaves; [`ApplyOptions::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// Namespace of the agent: inventory, snapshots and release-manifest ConfigMaps live here.
    pub agent_namespace: String,
    /// Inventory id: tells this installation's objects from others'. Default `fleetgate`.
    pub inventory: String,
    /// Objects applied at once within one phase.
    pub concurrency: usize,
    /// How long a CRD may take to become Established, and discovery to serve its kinds.
    pub crd_timeout: Duration,
    /// Wait for Deployments/StatefulSets/DaemonSets to roll out before the next phase, at most
    /// this long. None: do not wait (the bake gates check availability).
    pub rollout_timeout: Option<Duration>,
    /// Prune may delete CustomResourceDefinitions a new release dropped (which deletes every
    /// custom resource of them). Default false: such CRDs are kept and reported.
    pub prune_crds: bool,
    /// Snapshots kept per inventory; older ones are deleted when a new one is taken.
    pub snapshot_history: usize,
    /// `release-manifest-<id>` ConfigMaps kept; the oldest beyond this are deleted.
    pub release_manifest_history: usize,
}

impl ApplyOptions {
    pub fn new(agent_namespace: impl Into<String>) -> Self {
        ApplyOptions {
            agent_namespace: agent_namespace.into(),
            inventory: crate::FIELD_MANAGER.to_string(),
            concurrency: 16,
            crd_timeout: Duration::from_secs(60),
            rollout_timeout: None,
            prune_crds: false,
            snapshot_history: 3,
            release_manifest_history: 10,
        }
    }

    /// The options of the agent of `cluster`: inventory id `fleetgate-<cluster>`. Every tool
    /// looking at that cluster (the agent, `fleetgate diff`) must use the same id, since it is
    /// part of the labels an applied object carries.
    pub fn for_cluster(agent_namespace: impl Into<String>, cluster: &str) -> Self {
        ApplyOptions { inventory: format!("{}-{cluster}", crate::FIELD_MANAGER), ..ApplyOptions::new(agent_namespace) }
    }

    /// The labels of what the engine keeps about this inventory in the agent namespace (the
    /// inventory, release manifests, snapshots): managed by fleetgate, this inventory, and `extra`.
    pub(crate) fn own_labels(&self, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (LABEL_MANAGED_BY.to_string(), crate::FIELD_MANAGER.to_string()),
            (LABEL_INVENTORY.to_string(), self.inventory.clone()),
        ]);
        labels.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        labels
    }
}

/// Why an apply, prune, snapshot, restore or drift check failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("cannot read the release's manifests")]
    Manifests(#[from] ManifestError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("release id {0:?} cannot be used as a label value (at most 63 characters: letters, digits, '-', '_', '.')")]
    InvalidReleaseId(String),
    #[error("server-side dry run refused {} object(s); nothing was applied:\n  {}", .0.len(), list(.0))]
    DryRun(Vec<ObjectFailure>),
    #[error(
        "the agent may not write {} object(s) of the release (RBAC); nothing was applied. Grant what the release \
         needs — `fleetgate agent rbac --release ID --repo REPO | kubectl apply -f -` — and the next pass applies \
         it:\n  {}",
        .0.len(),
        list(.0)
    )]
    Forbidden(Vec<ObjectFailure>),
    #[error("applying phase {phase} failed for {} object(s):\n  {}", .failures.len(), list(.failures))]
    Apply { phase: Phase, failures: Vec<ObjectFailure>, applied: Box<ChangeSet> },
    #[error("CustomResourceDefinition {name} did not become Established within {timeout:?}")]
    CrdNotEstablished { name: String, timeout: Duration },
    #[error("the API server does not serve {kinds} within {timeout:?} of its CRD being Established")]
    KindsNotServed { kinds: String, timeout: Duration },
    #[error("{object} did not roll out within {timeout:?}: {state}")]
    RolloutTimeout { object: Box<ObjectKey>, timeout: Duration, state: String },
    #[error("prune could not delete {} object(s) (they stay pending):\n  {}", .failures.len(), prune::describe(.failures))]
    Prune { failures: Vec<(ObjectKey, String)>, pruned: Vec<ObjectChange> },
    #[error("waiting for {what}: {reason}")]
    Wait { what: String, reason: String },
    #[error("inventory ConfigMap {namespace}/{name} is unreadable: {reason}")]
    Inventory { namespace: String, name: String, reason: String },
    #[error("snapshot {id}: {reason}")]
    Snapshot { id: String, reason: String },
    #[error(
        "snapshot {id} (labelled as {release}'s) does not verify under the agent key: it was edited, or not written by this agent; refusing to restore it"
    )]
    SnapshotUnauthenticated { id: String, release: String },
    #[error("{action}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
}

impl ApplyError {
    /// Stalling when retrying the same release cannot help (the release or the configuration
    /// must change): bad manifests, policy and dry-run refusals. Timeouts and API errors may be
    /// transient.
    pub fn class(&self) -> ErrorClass {
        match self {
            ApplyError::Manifests(_)
            | ApplyError::Admission(_)
            | ApplyError::InvalidReleaseId(_)
            | ApplyError::DryRun(_)
            | ApplyError::SnapshotUnauthenticated { .. } => ErrorClass::Stalling,
            _ => ErrorClass::Retryable,
        }
    }

    /// A short label for metrics and events.
    pub fn reason(&self) -> &'static str {
        match self {
            ApplyError::Manifests(_) => "InvalidManifests",
            ApplyError::Admission(_) => "AdmissionRefused",
            ApplyError::InvalidReleaseId(_) => "InvalidReleaseId",
            ApplyError::DryRun(_) => "DryRunFailed",
            ApplyError::Forbidden(_) => "RbacMissing",
            ApplyError::Apply { .. } => "ApplyFailed",
            ApplyError::CrdNotEstablished { .. } => "CrdNotEstablished",
            ApplyError::KindsNotServed { .. } => "KindsNotServed",
            ApplyError::RolloutTimeout { .. } => "RolloutTimeout",
            ApplyError::Prune { .. } => "PruneFailed",
            ApplyError::Wait { .. } => "WaitFailed",
            ApplyError::Inventory { .. } => "InventoryUnreadable",
            ApplyError::Snapshot { .. } => "SnapshotFailed",
            ApplyError::SnapshotUnauthenticated { .. } => "SnapshotUnauthenticated",
            ApplyError::Kube { .. } => "ApiError",
        }
    }
}

fn list(failures: &[ObjectFailure]) -> String {
    failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("\n  ")
}

pub(crate) fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ApplyError {
    let action = action.into();
    move |source| ApplyError::Kube { action, source }
}

/// A Namespace that fleetgate's own installation created for the release to land in (deploy/'s
/// `operator-namespace.yaml`, the Namespaces `fleetgate agent rbac` prints before the Roles in
/// them; both labelled `app.kubernetes.io/part-of: fleetgate`): a release shipping the same
/// Namespace takes it over without an adopt annotation. It was never someone else's.
fn made_for_fleetgate(m: &Manifest, live: &DynamicObject) -> bool {
    m.key.is("", "Namespace") && live.labels().get(LABEL_PART_OF).is_some_and(|v| v == "fleetgate")
}

/// The message of an API error without kube's wrapping.
pub(crate) fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

/// The API server is away or overloaded: no connection, no answer in time, 429, 503, 504. A step
/// after the dry run that meets one reports [`ApplyError::Kube`]: the agent applies the release
/// again later and does not roll back (which could not reach the server either). A 500 is an
/// answer about the object (a webhook that failed on it, say) and fails the release as before.
pub(crate) fn is_unreachable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => matches!(s.code, 429 | 503 | 504),
        _ => true,
    }
}

/// Errors that say nothing certain about the object sent: [`is_unreachable`] or any 5xx. A dry
/// run that meets one has applied nothing and may pass on a retry.
pub(crate) fn is_transient(e: &kube::Error) -> bool {
    is_unreachable(e) || matches!(e, kube::Error::Api(s) if s.code >= 500)
}

pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// What [`Engine::dry_run`] found: every object the server checked, as it would store it, and
/// what [`Engine::changes`] needs to say what the apply would do.
#[derive(Debug)]
pub struct DryRun {
    /// Objects whose dry run must wait for an earlier phase (see the module docs).
    deferred: Vec<DeferredDryRun>,
    results: phases::DryRuns,
    /// Objects the apply would leave alone (neither dry-run nor applied).
    left_alone: BTreeSet<ObjectKey>,
    previous: Option<Inventory>,
    /// Live objects fleetgate did not apply that the apply would adopt.
    adopted: BTreeSet<ObjectKey>,
}

/// Whether the server would store `would_be` as `live` is: the same object once the fields
/// every write moves (managed fields, resourceVersion) are set aside.
fn same_content(live: &DynamicObject, would_be: &DynamicObject) -> bool {
    let bare = |o: &DynamicObject| {
        let mut o = o.clone();
        o.metadata.managed_fields = None;
        o.metadata.resource_version = None;
        serde_json::to_value(o).ok()
    };
    bare(live) == bare(would_be)
}

/// A release that passed the manifests stage: parsed against the cluster's discovery, admitted
/// by the policy, labelled. Only [`Engine::admit`] makes one.
pub struct AdmittedSet<'r> {
    release: &'r VerifiedRelease,
    set: ManifestSet,
    resolver: phases::Resolver,
    /// The policy it was admitted by: the apply asks it about adopting live objects.
    policy: AdmissionPolicy,
}

impl AdmittedSet<'_> {
    pub fn release(&self) -> &VerifiedRelease {
        self.release
    }

    /// The objects, labelled, in apply order.
    pub fn manifests(&self) -> &ManifestSet {
        &self.set
    }

    /// The release's CustomResourceDefinitions, typed.
    pub fn crds(&self) -> &[CustomResourceDefinition] {
        self.set.crds()
    }

    /// Applies `live` (the cluster's CRD) instead of the release's CRD of that name — a rollback
    /// that cannot take a CRD back (see `gates::crd_compat::crds_to_keep`) keeps it as it is.
    pub fn keep_live_crd(&mut self, live: &CustomResourceDefinition) -> bool {
        self.set.replace_crd(live)
    }
}

/// Applies releases to one cluster and keeps their record there.
#[derive(Clone)]
pub struct Engine {
    client: Client,
    options: ApplyOptions,
}

impl Engine {
    pub fn new(client: Client, options: ApplyOptions) -> Self {
        Engine { client, options }
    }

    pub fn options(&self) -> &ApplyOptions {
        &self.options
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The manifests stage of a pass: parses `release` against the cluster's discovery (scopes;
    /// the release's default namespace), checks it against the admission `policy` and labels every object.
    /// Built once per pass; [`dry_run`](Self::dry_run) and [`apply`](Self::apply) take it.
    pub async fn admit<'r>(
        &self,
        release: &'r VerifiedRelease,
        policy: &AdmissionPolicy,
    ) -> Result<AdmittedSet<'r>, ApplyError> {
        if !is_label_value(release.id()) {
            return Err(ApplyError::InvalidReleaseId(release.id().to_string()));
        }
        let resolver = phases::Resolver::new(self.client.clone()).await?;
        let mut set = ManifestSet::from_release(release, resolver.discovery())?;
        policy.check(&set, &self.live_api(&resolver, &set).await?)?;
        set.add_labels(&self.labels());
        Ok(AdmittedSet { release, set, resolver, policy: policy.clone() })
    }

    /// What admission of `set` needs of the live cluster: what it serves (from `resolver`'s
    /// discovery), the CRDs fleetgate's inventory holds, and the rules of every role a binding of
    /// `set` grants that `set` does not define. Apply and restore judge against the same.
    async fn live_api(&self, resolver: &phases::Resolver, set: &ManifestSet) -> Result<LiveApi, ApplyError> {
        use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
        use kube::api::Api;
        let inventory = inventory::read(&self.client, &self.options).await?;
        let fleetgate_crds = inventory
            .iter()
            .flat_map(|inv| inv.objects.iter().chain(&inv.pending_prune))
            .filter(|e| e.group == crate::manifests::CRD_GROUP && e.kind == crate::manifests::CRD_KIND)
            .map(|e| e.name.clone());
        let adopted: &[ObjectKey] = inventory.as_ref().map(|inv| inv.adopted.as_slice()).unwrap_or_default();
        let (mut roles, mut pruned) = (BTreeMap::new(), BTreeSet::new());
        for role in admission::roles_outside(set) {
            let reading = kube_err(format!("reading {role}, which a binding of the release grants"));
            let rules = match &role.namespace {
                None => Api::<ClusterRole>::all(self.client.clone())
                    .get_opt(&role.name)
                    .await
                    .map_err(reading)?
                    .map(|r| (r.metadata, r.rules)),
                Some(ns) => Api::<Role>::namespaced(self.client.clone(), ns)
                    .get_opt(&role.name)
                    .await
                    .map_err(reading)?
                    .map(|r| (r.metadata, r.rules)),
            };
            let Some((meta, rules)) = rules else { continue };
            // Applied by this inventory, dropped by `set`, not adopted: prune deletes it after the apply.
            let ours = meta.labels.as_ref().and_then(|l| l.get(LABEL_INVENTORY)) == Some(&self.options.inventory);
            if ours && !adopted.contains(&role.key()) {
                pruned.insert(role);
                continue;
            }
            let rules =
                rules.unwrap_or_default().into_iter().map(|r| serde_json::to_value(r).expect("rules serialize"));
            roles.insert(role, rules.collect());
        }
        Ok(LiveApi::from_discovery(resolver.discovery(), fleetgate_crds, &self.options.agent_namespace)
            .with_roles(roles, pruned))
    }

    /// Checks an admitted set without changing anything: a server-side dry run of every object
    /// the server can check now, but those the apply would leave alone (see the module docs).
    /// Returns the objects whose dry run must wait for an earlier phase (see the module docs).
    ///
    /// Also refuses ([`ApplyError::Admission`]) taking over live objects fleetgate did not apply
    /// (see the module docs).
    pub async fn dry_run(&self, admitted: &AdmittedSet<'_>) -> Result<DryRun, ApplyError> {
        let previous = inventory::read(&self.client, &self.options).await?;
        let key = self.existing_agent_key().await?;
        let records = self.trusted_records(&admitted.set, previous.as_ref(), key.as_ref());
        let leave = self.unchanged(&admitted.resolver, &admitted.set, &records).await?;
        let (results, deferred) = self.dry_run_first(&admitted.resolver, &admitted.set, &leave).await?;
        let adopted = self.adoptions(admitted, previous.as_ref(), &results, &deferred).await?;
        Ok(DryRun { deferred, results, left_alone: leave.into_keys().collect(), previous, adopted })
    }

    /// What applying `admitted` (then pruning) would do to each object, from its [`dry_run`](Self::dry_run)
    /// and without changing anything: objects the apply would leave alone are `unchanged`; an
    /// object the dry run found absent is `created`; one it found is `configured` when what the
    /// server would store differs from the live object (its managed fields and resourceVersion
    /// aside), else `unchanged`; objects the dry run deferred are `created` when nothing of that
    /// name exists yet, else `configured` (the server cannot say before the earlier phase is
    /// applied). What the inventory holds and `admitted` drops is `pruned`, or `retained` where
    /// prune would keep it (the same rules). Reads each object the dry run found, once.
    pub async fn changes(&self, admitted: &AdmittedSet<'_>, dry_run: &DryRun) -> Result<ChangeSet, ApplyError> {
        let mut changes = ChangeSet::new(admitted.release.id());
        for m in admitted.set.iter() {
            let action = if dry_run.left_alone.contains(&m.key) {
                Action::Unchanged
            } else {
                let live = match admitted.resolver.api(m) {
                    Ok(api) => api.get_opt(&m.key.name).await.map_err(kube_err(format!("reading {}", m.key)))?,
                    // Not served yet: its CRD comes with the release, so no object of it exists.
                    Err(_) => None,
                };
                match (live, dry_run.results.get(&m.key)) {
                    (None, _) => Action::Created,
                    (Some(live), Some(would_be)) if same_content(&live, would_be) => Action::Unchanged,
                    (Some(_), _) => Action::Configured,
                }
            };
            changes.changes.push(ObjectChange { object: m.key.clone(), phase: m.phase, action });
        }
        let keep: BTreeSet<&ObjectKey> = admitted.set.iter().map(|m| &m.key).collect();
        let in_use: BTreeSet<String> = admitted.set.iter().filter_map(|m| m.key.namespace.clone()).collect();
        let adopted: Vec<ObjectKey> =
            dry_run.previous.iter().flat_map(|p| &p.adopted).chain(&dry_run.adopted).cloned().collect();
        let dropped = dry_run.previous.iter().flat_map(|p| p.objects.iter().chain(&p.pending_prune));
        let mut pruned: Vec<ObjectChange> = dropped
            .filter(|e| !keep.contains(&e.key()))
            .map(|e| {
                let action = match prune::plan(e, admitted.release.id(), &in_use, &adopted, self.options.prune_crds) {
                    prune::Plan::Delete => Action::Pruned,
                    prune::Plan::Retain(why) => Action::Retained(why),
                };
                ObjectChange { object: e.key(), phase: e.phase(), action }
            })
            .collect();
        pruned.sort_by(|a, b| a.object.cmp(&b.object));
        pruned.dedup_by(|a, b| a.object == b.object);
        changes.changes.extend(pruned);
        changes.dry_run_deferred = dry_run.deferred.clone();
        Ok(changes)
    }

    /// Applies an admitted release: the objects it would not change are left alone (see the
    /// module docs); a server-side dry run of the others (nothing is applied if any fails), the
    /// inventory (objects of the previous release that this one dropped are marked for
    /// [`prune`](Self::prune)), server-side apply (field manager `fleetgate`, forced) phase by
    /// phase, the inventory's records of what was applied, and ConfigMap `release-manifest-<id>`.
    ///
    /// The inventory is written before the first object changes, so an apply that fails half
    /// way still records what it may have created: applying the previous release again and
    /// pruning removes it. The records it keeps until the phases are done are the previous
    /// ones: an object written since has another resourceVersion than its record, so it is not
    /// taken as unchanged. Re-applying the release that is already applied changes nothing; it
    /// corrects drift, since a drifted object is not left alone.
    pub async fn apply(&self, admitted: AdmittedSet<'_>) -> Result<ChangeSet, ApplyError> {
        let previous = inventory::read(&self.client, &self.options).await?;
        let key = self.existing_agent_key().await?;
        let mut records = self.trusted_records(&admitted.set, previous.as_ref(), key.as_ref());
        let leave = self.unchanged(&admitted.resolver, &admitted.set, &records).await?;
        let (before, deferred) = self.dry_run_first(&admitted.resolver, &admitted.set, &leave).await?;
        let adopted = self.adoptions(&admitted, previous.as_ref(), &before, &deferred).await?;
        let AdmittedSet { release, set, mut resolver, .. } = admitted;
        let key = match key {
            Some(key) => key,
            None => self.agent_key().await?,
        };
        let seal = |records: &unchanged::Records| {
            SealedRecords::seal(&key, &self.options.inventory, records.values().cloned())
        };
        let mut inventory =
            inventory::write(&self.client, &self.options, &set, previous.as_ref(), &adopted, seal(&records)).await?;
        let mut changes = ChangeSet::new(release.id());
        let applied = self.apply_phases("apply", &mut resolver, &set, &leave, before, deferred, &mut changes).await?;
        records.extend(applied.into_iter().map(|r| (r.object.clone(), r)));
        let sealed = seal(&records);
        if sealed != inventory.applied {
            inventory.applied = sealed;
            inventory::store(&self.client, &self.options, &inventory).await?;
        }
        inventory::write_release_manifest(&self.client, &self.options, release).await?;
        Ok(changes)
    }

    /// Dry-runs every object the server can check now but those in `leave` (they are not
    /// applied); all refusals are reported together.
    ///
    /// Two kinds of object wait (they are returned as deferred): objects in a namespace the
    /// release creates (the server refuses anything in a namespace that does not exist), and
    /// custom resources of a CRD the release creates or changes (the server can only check them
    /// against the new schema once it has it). Custom resources of a CRD that stays as it is
    /// are checked now, against the schema they will meet.
    async fn dry_run_first(
        &self,
        resolver: &phases::Resolver,
        set: &ManifestSet,
        leave: &unchanged::Records,
    ) -> Result<(phases::DryRuns, Vec<DeferredDryRun>), ApplyError> {
        let checked = |m: &&Manifest| !leave.contains_key(&m.key);
        let (mut failures, mut forbidden) = (Vec::new(), Vec::new());
        let mut collect = |result: Result<phases::DryRuns, ApplyError>| match result {
            Ok(r) => Ok(r),
            Err(ApplyError::DryRun(f)) => {
                failures.extend(f);
                Ok(phases::DryRuns::new())
            }
            Err(ApplyError::Forbidden(f)) => {
                forbidden.extend(f);
                Ok(phases::DryRuns::new())
            }
            Err(e) => Err(e),
        };
        let first: Vec<_> = set.iter().filter(checked).filter(|m| m.phase <= Phase::Crds).collect();
        let mut results = collect(phases::dry_run(resolver, &first, &self.options).await)?;

        let is_new = |m: &&Manifest| {
            results.get(&m.key).and_then(|d| d.metadata.resource_version.as_deref()).is_none_or(str::is_empty)
        };
        let new_namespaces: BTreeSet<&str> =
            set.phase(Phase::Namespaces).filter(checked).filter(is_new).map(|m| m.key.name.as_str()).collect();
        let mut changing_crds = Vec::new();
        for m in set.phase(Phase::Crds).filter(checked) {
            let would_be = results.get(&m.key).and_then(|d| d.data.get("spec"));
            let live = match (is_new(&m), resolver.api(m)) {
                (false, Ok(api)) => api.get_opt(&m.key.name).await.map_err(kube_err(format!("reading {}", m.key)))?,
                _ => None,
            };
            if would_be.is_none() || live.as_ref().and_then(|l| l.data.get("spec")) != would_be {
                changing_crds.extend(
                    set.crds().iter().filter(|c| c.metadata.name.as_ref() == Some(&m.key.name)).map(CrdNames::of),
                );
            }
        }
        let deferred: Vec<DeferredDryRun> = set
            .iter()
            .filter(checked)
            .filter(|m| m.phase > Phase::Crds)
            .filter_map(|m| {
                let after = if changing_crds.iter().any(|c| c.group == m.key.group && c.kind == m.key.kind) {
                    Phase::Crds
                } else if m.key.namespace.as_deref().is_some_and(|ns| new_namespaces.contains(ns)) {
                    Phase::Namespaces
                } else {
                    return None;
                };
                Some(DeferredDryRun { object: m.key.clone(), after })
            })
            .collect();
        let now: Vec<_> = set
            .iter()
            .filter(checked)
            .filter(|m| m.phase > Phase::Crds && !deferred.iter().any(|d| d.object == m.key))
            .collect();
        results.extend(collect(phases::dry_run(resolver, &now, &self.options).await)?);
        if !forbidden.is_empty() {
            forbidden.sort_by(|a, b| a.object.cmp(&b.object));
            return Err(ApplyError::Forbidden(forbidden));
        }
        if !failures.is_empty() {
            failures.sort_by(|a, b| a.object.cmp(&b.object));
            return Err(ApplyError::DryRun(failures));
        }
        Ok((results, deferred))
    }

    /// The objects of `admitted` that exist in the cluster although fleetgate did not apply
    /// them, all of which the release or the policy allows adopting; otherwise every object that
    /// may not be taken over, as an admission refusal. Fleetgate applied an object when
    /// `previous` (the inventory) lists it, or when it still carries this inventory's label (a
    /// CRD or Namespace prune kept after a release dropped it). `results` and `deferred` are the
    /// first dry run's: a result without a resourceVersion is an object that does not exist.
    async fn adoptions(
        &self,
        admitted: &AdmittedSet<'_>,
        previous: Option<&Inventory>,
        results: &phases::DryRuns,
        deferred: &[DeferredDryRun],
    ) -> Result<BTreeSet<ObjectKey>, ApplyError> {
        let known: BTreeSet<ObjectKey> =
            previous.iter().flat_map(|p| p.objects.iter().chain(&p.pending_prune)).map(InventoryEntry::key).collect();
        let mut adopted = BTreeSet::new();
        let mut violations = Vec::new();
        for m in admitted.set.iter().filter(|m| !known.contains(&m.key)) {
            let absent = match results.get(&m.key) {
                Some(would_be) => would_be.metadata.resource_version.as_deref().is_none_or(str::is_empty),
                // In a namespace the release creates: nothing exists there yet.
                None => deferred.iter().any(|d| d.object == m.key && d.after == Phase::Namespaces),
            };
            // Not served yet (the kind's CRD is new): no object of it exists either.
            let Some(api) = admitted.resolver.api(m).ok().filter(|_| !absent) else { continue };
            let live = api.get_opt(&m.key.name).await.map_err(kube_err(format!("reading {}", m.key)))?;
            let Some(live) = live else { continue };
            if live.labels().get(LABEL_INVENTORY) == Some(&self.options.inventory) || made_for_fleetgate(m, &live) {
                continue;
            }
            match admitted.policy.unmanaged(m) {
                Some(v) => violations.push(v),
                None => {
                    adopted.insert(m.key.clone());
                }
            }
        }
        if violations.is_empty() { Ok(adopted) } else { Err(AdmissionError { violations }.into()) }
    }

    /// Applies `set` phase by phase but the objects in `leave`, with the waits between phases,
    /// recording into `changes`; returns what the server stored for each object written.
    /// Deferred dry runs happen right after the phase they wait for, before anything later.
    /// `stage` (`apply`, `restore`) names its stop point `<stage>.after-first-phase`.
    #[allow(clippy::too_many_arguments)] // one call per stage; the values are the stage's own
    async fn apply_phases(
        &self,
        stage: &str,
        resolver: &mut phases::Resolver,
        set: &ManifestSet,
        leave: &unchanged::Records,
        mut before: phases::DryRuns,
        deferred: Vec<DeferredDryRun>,
        changes: &mut ChangeSet,
    ) -> Result<Vec<AppliedRecord>, ApplyError> {
        let mut applied = Vec::new();
        let mut first = true;
        for phase in Phase::ALL {
            let objects: Vec<_> = set.phase(phase).collect();
            if objects.is_empty() {
                continue;
            }
            phases::apply_phase(resolver, &objects, leave, &before, &self.options, changes, &mut applied).await?;
            if first {
                first = false;
                crate::model::stop_point::reached(&format!("{stage}.after-first-phase")).await;
            }
            if phase == Phase::Crds {
                let written: Vec<_> = objects.iter().copied().filter(|m| !leave.contains_key(&m.key)).collect();
                // CRDs left alone are as Established as they were, and their kinds as served.
                if !written.is_empty() {
                    phases::crds_established(&self.client, &written, &self.options).await?;
                    resolver.refresh_until_served(set, self.options.crd_timeout).await?;
                }
            }
            let waiting: Vec<_> =
                deferred.iter().filter(|d| d.after == phase).filter_map(|d| set.get(&d.object)).collect();
            if !waiting.is_empty() {
                before.extend(phases::dry_run(resolver, &waiting, &self.options).await?);
            }
            if phase == Phase::Workloads
                && let Some(timeout) = self.options.rollout_timeout
            {
                rollout::wait_all(resolver, &objects, timeout).await?;
            }
        }
        changes.dry_run_deferred = deferred;
        Ok(applied)
    }

    /// The labels of every applied object: the same for every release (see the module docs).
    fn labels(&self) -> [(&'static str, String); 2] {
        [(LABEL_MANAGED_BY, crate::FIELD_MANAGER.to_string()), (LABEL_INVENTORY, self.options.inventory.clone())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_is_unchanged_when_only_what_every_write_moves_differs() {
        let object = |rv: &str, manager: &str, data: &str| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "namespace": "n", "resourceVersion": rv,
                             "managedFields": [{"manager": manager, "operation": "Apply"}]},
                "data": {"k": data},
            }))
            .unwrap()
        };
        assert!(same_content(&object("1", "fleetgate", "v"), &object("2", "someone", "v")));
        assert!(!same_content(&object("1", "fleetgate", "v"), &object("1", "fleetgate", "w")));
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status { code, ..Default::default() }))
    }

    /// After the dry run only an away or overloaded server is a retry without rollback; a 500
    /// (a webhook that failed on the object) still fails the release. A dry run retries any 5xx.
    #[test]
    fn which_api_errors_are_the_servers_and_not_the_objects() {
        let refused = kube::Error::Service("tcp connect error: Connection refused".into());
        for (e, unreachable, transient) in [
            (refused, true, true),
            (api_error(429), true, true),
            (api_error(503), true, true),
            (api_error(504), true, true),
            (api_error(500), false, true),
            (api_error(422), false, false),
            (api_error(403), false, false),
            (api_error(404), false, false),
        ] {
            assert_eq!((is_unreachable(&e), is_transient(&e)), (unreachable, transient), "{e:?}");
        }
    }
}
