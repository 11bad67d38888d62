//! The mechanics shared by apply, restore and drift: resolving objects to API endpoints through
//! discovery, server-side dry runs, one phase of server-side applies with bounded concurrency,
//! and waiting for CRDs to be Established.

use super::unchanged::{Records, object_hash};
use super::{
    AppliedRecord, ApplyError, ApplyOptions, ChangeSet, ObjectChange, ObjectFailure, api_message, is_transient,
    is_unreachable, kube_err,
};
use crate::apply::Action;
use crate::manifests::{Manifest, ManifestSet, ObjectKey, api_version};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use kube::runtime::wait::{self, await_condition, conditions};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// Discovery of one cluster, refreshed when a release adds kinds.
pub(crate) struct Resolver {
    client: Client,
    discovery: Discovery,
}

impl Resolver {
    pub(crate) async fn new(client: Client) -> Result<Self, ApplyError> {
        let discovery = run_discovery(&client).await?;
        Ok(Resolver { client, discovery })
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn discovery(&self) -> &Discovery {
        &self.discovery
    }

    /// The API endpoint of `m`, or why there is none (its version is not served).
    pub(crate) fn api(&self, m: &Manifest) -> Result<Api<DynamicObject>, String> {
        let (ar, caps) = self.discovery.resolve_gvk(&m.gvk).ok_or_else(|| {
            format!("the API server does not serve {} {}", api_version(&m.gvk.group, &m.gvk.version), m.gvk.kind)
        })?;
        Ok(match (&caps.scope, &m.key.namespace) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        })
    }

    /// Re-runs discovery until every kind of `set` resolves: the API server serves a new CRD's
    /// kinds a moment after the CRD is Established, and discovery lags behind it.
    pub(crate) async fn refresh_until_served(
        &mut self,
        set: &ManifestSet,
        timeout: Duration,
    ) -> Result<(), ApplyError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            self.discovery = run_discovery(&self.client).await?;
            let missing: BTreeSet<String> = set
                .iter()
                .filter(|m| self.discovery.resolve_gvk(&m.gvk).is_none())
                .map(|m| format!("{} {}", api_version(&m.gvk.group, &m.gvk.version), m.gvk.kind))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                let kinds = missing.into_iter().collect::<Vec<_>>().join(", ");
                return Err(ApplyError::KindsNotServed { kinds, timeout });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

async fn run_discovery(client: &Client) -> Result<Discovery, ApplyError> {
    Discovery::new(client.clone()).run_aggregated().await.map_err(kube_err("API discovery"))
}

/// The result of a server-side dry run of each object: the object as it would be stored. Its
/// resourceVersion is the live object's, or empty when the object does not exist yet.
pub(crate) type DryRuns = HashMap<ObjectKey, DynamicObject>;

/// Server-side apply as field manager `fleetgate`, forced: the release's fields are taken back
/// from whoever changed them (that is how drift is corrected).
fn params() -> PatchParams {
    PatchParams::apply(crate::FIELD_MANAGER).force()
}

/// One object's request: its failure carries the error when that was the server's, not the
/// object's (see `dry_run` and `apply_phase` for which errors count).
type PerObject<T> = Result<T, (ObjectFailure, Option<kube::Error>)>;

/// Server-side dry run of `objects`; every refusal is reported at once. The results tell
/// created, configured and unchanged apart after the real apply.
///
/// A refusal (validation, schema, admission, a version not served) is [`ApplyError::DryRun`];
/// a refusal of the agent's own permissions (403) is [`ApplyError::Forbidden`], which the
/// cluster's RBAC must fix, not the release; an error that says nothing about the object
/// (network, 429, 5xx — an unreachable admission webhook included) is [`ApplyError::Kube`],
/// which may pass on a retry.
pub(crate) async fn dry_run(
    resolver: &Resolver,
    objects: &[&Manifest],
    options: &ApplyOptions,
) -> Result<DryRuns, ApplyError> {
    let pp = params().dry_run();
    let results: Vec<PerObject<(ObjectKey, DynamicObject)>> = stream::iter(objects.iter().copied())
        .map(|m| {
            let pp = pp.clone();
            async move {
                let fail = |message: String| ObjectFailure { object: m.key.clone(), source: m.source.clone(), message };
                let api = resolver.api(m).map_err(|message| (fail(message), None))?;
                match api.patch(&m.key.name, &pp, &Patch::Apply(&m.object)).await {
                    Ok(out) => Ok((m.key.clone(), out)),
                    Err(e) if is_transient(&e) || is_forbidden(&e) => Err((fail(api_message(&e)), Some(e))),
                    Err(e) => Err((fail(api_message(&e)), None)),
                }
            }
        })
        .buffer_unordered(options.concurrency.max(1))
        .collect()
        .await;
    let mut out = DryRuns::new();
    let (mut failures, mut forbidden) = (Vec::new(), Vec::new());
    for r in results {
        match r {
            Ok((key, obj)) => {
                out.insert(key, obj);
            }
            Err((failure, Some(e))) if is_forbidden(&e) => forbidden.push(failure),
            Err((failure, Some(source))) => {
                return Err(ApplyError::Kube { action: format!("dry run of {}", failure.object), source });
            }
            Err((failure, None)) => failures.push(failure),
        }
    }
    // The permissions first: with them fixed, the next pass shows the release's own refusals.
    for list in [&mut forbidden, &mut failures] {
        list.sort_by(|a, b| a.object.cmp(&b.object));
    }
    if !forbidden.is_empty() {
        return Err(ApplyError::Forbidden(forbidden));
    }
    if !failures.is_empty() {
        return Err(ApplyError::DryRun(failures));
    }
    Ok(out)
}

/// The API server refused the agent's credentials the request (RBAC), not the object.
fn is_forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

/// Server-side applies every object of one phase but those in `leave` (unchanged, see
/// `unchanged`), `options.concurrency` at a time, records each outcome in `changes` (in the
/// phase's order) and what the server stored for each written object in `applied`. Any failure
/// fails the phase after every object of it was tried.
pub(crate) async fn apply_phase(
    resolver: &Resolver,
    objects: &[&Manifest],
    leave: &Records,
    before: &DryRuns,
    options: &ApplyOptions,
    changes: &mut ChangeSet,
    applied: &mut Vec<AppliedRecord>,
) -> Result<(), ApplyError> {
    let pp = params();
    type Outcome = PerObject<(Action, Option<AppliedRecord>)>;
    let results: Vec<(usize, Outcome)> = stream::iter(objects.iter().copied().enumerate())
        .map(|(i, m)| {
            let pp = pp.clone();
            async move {
                if leave.contains_key(&m.key) {
                    return (i, Ok((Action::Unchanged, None)));
                }
                let fail = |message: String| ObjectFailure { object: m.key.clone(), source: m.source.clone(), message };
                let result = async {
                    let api = resolver.api(m).map_err(|message| (fail(message), None))?;
                    let out = api.patch(&m.key.name, &pp, &Patch::Apply(&m.object)).await.map_err(|e| {
                        let failure = fail(api_message(&e));
                        (failure, is_unreachable(&e).then_some(e))
                    })?;
                    let rv_before = before.get(&m.key).and_then(|d| d.resource_version()).filter(|rv| !rv.is_empty());
                    let action = match rv_before {
                        None => Action::Created,
                        Some(rv) if out.resource_version().as_ref() == Some(&rv) => Action::Unchanged,
                        Some(_) => Action::Configured,
                    };
                    let record = AppliedRecord {
                        object: m.key.clone(),
                        hash: object_hash(m),
                        uid: out.uid().unwrap_or_default(),
                        resource_version: out.resource_version().unwrap_or_default(),
                    };
                    Ok((action, Some(record)))
                }
                .await;
                (i, result)
            }
        })
        .buffer_unordered(options.concurrency.max(1))
        .collect()
        .await;
    let mut results = results;
    results.sort_by_key(|(i, _)| *i);
    let mut failures = Vec::new();
    let mut unavailable = None;
    for (i, r) in results {
        match r {
            Ok((action, record)) => {
                applied.extend(record);
                changes.changes.push(ObjectChange { object: objects[i].key.clone(), phase: objects[i].phase, action })
            }
            Err((failure, Some(source))) => unavailable = unavailable.or(Some((failure, source))),
            Err((failure, None)) => failures.push(failure),
        }
    }
    if let Some((failure, source)) = unavailable {
        // The server, not the release: applying it again once the server answers is the
        // remedy, not a rollback (which could not reach the server either).
        Err(ApplyError::Kube { action: format!("applying {}", failure.object), source })
    } else if failures.is_empty() {
        Ok(())
    } else {
        Err(ApplyError::Apply { phase: objects[0].phase, failures, applied: Box::new(changes.clone()) })
    }
}

/// How long a CRD whose names are accepted may stay not Established before it is nudged (below).
/// An API server of an HA control plane waits 5 s on purpose before establishing a CRD.
const NUDGE_AFTER: Duration = Duration::from_secs(10);

/// Marks the CRD written by a nudge; removed right away, so the CRD ends as the release wrote it.
const NUDGE_ANNOTATION: &str = "fleetgate.io/establish-nudge";

/// Waits until every CRD among `objects` is Established, each within `options.crd_timeout`.
///
/// kube-apiserver establishes a CRD when it sees an *update* whose names are accepted and which is
/// not yet Established. An API server stopped between writing `NamesAccepted` and `Established`
/// finds, once restarted, only that CRD's *add* event: the CRD stays unestablished until the next
/// informer resync, minutes later. So a CRD in that state after [`NUDGE_AFTER`] gets an update
/// (an annotation set and removed again), and the wait goes on for the rest of the timeout.
pub(crate) async fn crds_established(
    client: &Client,
    objects: &[&Manifest],
    options: &ApplyOptions,
) -> Result<(), ApplyError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let timeout = options.crd_timeout;
    stream::iter(objects.iter().map(|m| m.key.name.clone()))
        .map(|name| {
            let api = api.clone();
            async move {
                let first = NUDGE_AFTER.min(timeout);
                if established_within(&api, &name, first).await? {
                    return Ok(());
                }
                match nudge(&api, &name).await {
                    Ok(()) => {}
                    Err(source) if is_unreachable(&source) => return Err(unreachable_waiting(&name, source)),
                    // Not allowed, say: the wait goes on and its timeout tells.
                    Err(e) => {
                        tracing::warn!(crd = %name, error = %api_message(&e), "could not update a CRD not Established")
                    }
                }
                match established_within(&api, &name, timeout - first).await? {
                    true => Ok(()),
                    false => Err(ApplyError::CrdNotEstablished { name, timeout }),
                }
            }
        })
        .buffer_unordered(options.concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Whether CRD `name` is Established within `timeout`. An unreachable server is
/// [`ApplyError::Kube`] (not the release's failure).
async fn established_within(
    api: &Api<CustomResourceDefinition>,
    name: &str,
    timeout: Duration,
) -> Result<bool, ApplyError> {
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, conditions::is_crd_established())).await {
        Ok(Ok(_)) => Ok(true),
        Ok(Err(wait::Error::ProbeFailed(
            watcher::Error::InitialListFailed(source)
            | watcher::Error::WatchStartFailed(source)
            | watcher::Error::WatchFailed(source),
        ))) if is_unreachable(&source) => Err(unreachable_waiting(name, source)),
        Ok(Err(e)) => Err(ApplyError::Wait { what: format!("CustomResourceDefinition {name}"), reason: e.to_string() }),
        Err(_) => Ok(false),
    }
}

fn unreachable_waiting(name: &str, source: kube::Error) -> ApplyError {
    ApplyError::Kube { action: format!("waiting for CustomResourceDefinition {name} to be Established"), source }
}

/// Updates CRD `name` (sets [`NUDGE_ANNOTATION`], then removes it) when its names are accepted and
/// it is not Established: the update the API server establishes a CRD on (see
/// [`crds_established`]). A CRD in any other state is left alone.
async fn nudge(api: &Api<CustomResourceDefinition>, name: &str) -> Result<(), kube::Error> {
    let crd = api.get(name).await?;
    let condition = |kind: &str| {
        crd.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == "True"))
    };
    if !condition("NamesAccepted") || condition("Established") {
        return Ok(());
    }
    tracing::warn!(crd = name, "names accepted but not Established: updating it so the API server establishes it");
    for value in [serde_json::json!(chrono::Utc::now().to_rfc3339()), serde_json::Value::Null] {
        let patch = serde_json::json!({"metadata": {"annotations": {NUDGE_ANNOTATION: value}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    Ok(())
}
