//! The agent as a spoke runs it: `deploy/`'s manifests (the resources its `kustomization.yaml`
//! lists, what `kubectl apply -k deploy/` installs) applied to a test cluster, and a kubeconfig
//! that authenticates as the `fleetgate-agent` ServiceAccount with a token from the TokenRequest
//! API — the credential a Pod of deploy/'s Deployment would get, so the agent has exactly
//! deploy/'s RBAC and nothing of the harness's admin certificate.
//!
//! [`DeployManifests::load`] reads the manifests; [`DeployManifests::replace_file`] swaps one file
//! for other content (a test of another Operator brings its own `rbac-operator.yaml`, as a user
//! would); [`DeployManifests::from_yaml`] takes them from elsewhere (the Helm chart's rendering);
//! [`TestCluster::deploy_agent`] applies them and mints the token ([`TestCluster::agent_identity`]
//! alone where something else installed them).

use crate::TestCluster;
use anyhow::Context as _;
use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use std::path::{Path, PathBuf};

/// Namespace and name of the agent's ServiceAccount in deploy/.
pub const AGENT_SERVICE_ACCOUNT: (&str, &str) = ("fleetgate-system", "fleetgate-agent");

/// Kinds of deploy/ that are not applied: the Deployment's Pod would run the image, which tests run
/// in-process or as a process of the built binary instead (under kwok it would only be a fake
/// container that claims to be an agent).
const NOT_APPLIED: &[&str] = &["Deployment"];

/// Tokens outlive any test or demo run; the API server caps nothing below this by default.
const TOKEN_SECONDS: i64 = 24 * 3600;

/// deploy/'s objects, by file, in `kustomization.yaml` order.
#[derive(Debug, Clone)]
pub struct DeployManifests {
    files: Vec<(String, Vec<DynamicObject>)>,
}

impl DeployManifests {
    /// `deploy/` of the fleetgate checkout, as shipped.
    pub fn shipped() -> anyhow::Result<DeployManifests> {
        DeployManifests::load(&crate::cluster::checkout_dir().join("deploy"))
    }

    /// The files `deploy_dir/kustomization.yaml` lists under `resources`.
    pub fn load(deploy_dir: &Path) -> anyhow::Result<DeployManifests> {
        #[derive(serde::Deserialize)]
        struct Kustomization {
            resources: Vec<String>,
        }
        let path = deploy_dir.join("kustomization.yaml");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let k: Kustomization = serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let mut files = Vec::new();
        for file in k.resources {
            let path = deploy_dir.join(&file);
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            files.push((file, parse_objects(&path.display().to_string(), &text)?));
        }
        Ok(DeployManifests { files })
    }

    /// The objects of one multi-document YAML stream, as one file named `source` — e.g. what
    /// `helm template deploy/chart` renders, installed the way `kubectl apply -k deploy/` would.
    pub fn from_yaml(source: &str, yaml: &str) -> anyhow::Result<DeployManifests> {
        Ok(DeployManifests { files: vec![(source.to_string(), parse_objects(source, yaml)?)] })
    }

    /// Every object, the Deployment included, in file order.
    pub fn all_objects(&self) -> Vec<&DynamicObject> {
        self.files.iter().flat_map(|(_, objs)| objs).collect()
    }

    /// Replaces the objects of `file` (a name `kustomization.yaml` lists) with the documents of
    /// `yaml`, the way a user edits that file for their own Operator.
    pub fn replace_file(mut self, file: &str, yaml: &str) -> anyhow::Result<DeployManifests> {
        let objects = parse_objects(file, yaml)?;
        let slot = self
            .files
            .iter_mut()
            .find(|(name, _)| name == file)
            .with_context(|| format!("{file} is not a resource of deploy/kustomization.yaml"))?;
        slot.1 = objects;
        Ok(self)
    }

    /// Every object that [`TestCluster::deploy_agent`] applies, Namespaces first (the namespaced
    /// objects need them), otherwise in file order.
    pub fn objects(&self) -> Vec<&DynamicObject> {
        let all = self.files.iter().flat_map(|(_, objs)| objs).filter(|o| !NOT_APPLIED.contains(&kind(o)));
        let (mut namespaces, rest): (Vec<_>, Vec<_>) = all.partition(|o| kind(o) == "Namespace");
        namespaces.extend(rest);
        namespaces
    }
}

fn kind(obj: &DynamicObject) -> &str {
    obj.types.as_ref().map(|t| t.kind.as_str()).unwrap_or_default()
}

fn parse_objects(file: &str, text: &str) -> anyhow::Result<Vec<DynamicObject>> {
    let mut out = Vec::new();
    for value in serde_saphyr::from_multiple::<serde_json::Value>(text).with_context(|| format!("parsing {file}"))? {
        let obj: DynamicObject =
            serde_json::from_value(value).with_context(|| format!("{file}: not a Kubernetes object"))?;
        anyhow::ensure!(obj.types.is_some() && obj.metadata.name.is_some(), "{file}: an object without kind or name");
        out.push(obj);
    }
    Ok(out)
}

/// A ServiceAccount's credentials in a test cluster: the agent's, from [`TestCluster::deploy_agent`],
/// or another's, from [`TestCluster::service_account_identity`].
#[derive(Clone)]
pub struct AgentIdentity {
    kubeconfig: PathBuf,
    client: kube::Client,
}

impl AgentIdentity {
    /// A kubeconfig (context = cluster name) whose user is the ServiceAccount's bearer token.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client authenticated with that token.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// `system:serviceaccount:<namespace>:<name>`.
    pub fn username() -> String {
        format!("system:serviceaccount:{}:{}", AGENT_SERVICE_ACCOUNT.0, AGENT_SERVICE_ACCOUNT.1)
    }
}

impl TestCluster {
    /// Applies `manifests` (server-side apply as the admin, as `kubectl apply` by whoever installs
    /// the agent), then [`agent_identity`](Self::agent_identity).
    pub async fn deploy_agent(&self, manifests: &DeployManifests) -> anyhow::Result<AgentIdentity> {
        let admin = self.client();
        let mut discovery = Discovery::new(admin.clone()).run().await.context("discovering the API")?;
        let params = PatchParams::apply("fleetgate-testenv").force();
        for obj in manifests.objects() {
            let types = obj.types.as_ref().expect("checked when parsed");
            let gvk = GroupVersionKind::try_from(types)?;
            let name = obj.metadata.name.as_deref().expect("checked when parsed");
            if discovery.resolve_gvk(&gvk).is_none() {
                // A kind served by a CRD applied just before needs a fresh look.
                discovery = Discovery::new(admin.clone()).run().await.context("discovering the API")?;
            }
            let (resource, caps) =
                discovery.resolve_gvk(&gvk).with_context(|| format!("{} {name}: kind not served", gvk.kind))?;
            let api: Api<DynamicObject> = match (caps.scope, obj.metadata.namespace.as_deref()) {
                (Scope::Namespaced, Some(ns)) => Api::namespaced_with(admin.clone(), ns, &resource),
                (Scope::Namespaced, None) => anyhow::bail!("{} {name}: namespaced but has no namespace", gvk.kind),
                (Scope::Cluster, _) => Api::all_with(admin.clone(), &resource),
            };
            api.patch(name, &params, &Patch::Apply(obj))
                .await
                .with_context(|| format!("applying {} {name}", gvk.kind))?;
        }
        self.agent_identity().await
    }

    /// The credentials of the agent's ServiceAccount, once something installed it (deploy/ through
    /// [`deploy_agent`](Self::deploy_agent), or the Helm chart): a TokenRequest token, written
    /// into `agent.kubeconfig` in the cluster's directory.
    pub async fn agent_identity(&self) -> anyhow::Result<AgentIdentity> {
        self.identity(AGENT_SERVICE_ACCOUNT.0, AGENT_SERVICE_ACCOUNT.1, "agent.kubeconfig").await
    }

    /// The credentials of any ServiceAccount `namespace/name` the test made (what an attack test's
    /// attacker holds): a TokenRequest token, written into `<namespace>-<name>.kubeconfig`.
    pub async fn service_account_identity(&self, namespace: &str, name: &str) -> anyhow::Result<AgentIdentity> {
        self.identity(namespace, name, &format!("{namespace}-{name}.kubeconfig")).await
    }

    async fn identity(&self, namespace: &str, name: &str, file: &str) -> anyhow::Result<AgentIdentity> {
        let token = self.service_account_token(namespace, name).await?;
        let kubeconfig = self.dir().join(file);
        std::fs::write(&kubeconfig, self.token_kubeconfig(name, &token)?)?;
        let client = crate::cluster::client_from_kubeconfig(&kubeconfig).await?;
        Ok(AgentIdentity { kubeconfig, client })
    }

    /// A token for ServiceAccount `namespace/name` from the TokenRequest API (the API server signs
    /// it with the cluster's service-account key).
    pub async fn service_account_token(&self, namespace: &str, name: &str) -> anyhow::Result<String> {
        let request = TokenRequest {
            spec: Some(TokenRequestSpec { expiration_seconds: Some(TOKEN_SECONDS), ..Default::default() }),
            ..Default::default()
        };
        let answer = Api::<ServiceAccount>::namespaced(self.client(), namespace)
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .with_context(|| format!("TokenRequest for ServiceAccount {namespace}/{name}"))?;
        answer.status.and_then(|s| s.token).filter(|t| !t.is_empty()).context("TokenRequest answered without a token")
    }

    fn token_kubeconfig(&self, user: &str, token: &str) -> anyhow::Result<String> {
        let ca = std::fs::read_to_string(self.dir().join("ca.crt")).context("reading the cluster's CA")?;
        let name = self.name();
        Ok(format!(
            "apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: {name}
  context:
    cluster: {name}
    user: {user}
current-context: {name}
",
            server = self.server_url(),
            ca = base64::engine::general_purpose::STANDARD.encode(ca),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> DeployManifests {
        DeployManifests::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")).unwrap()
    }

    #[test]
    fn deploy_manifests_put_namespaces_first_and_leave_the_deployment_out() {
        let m = shipped();
        let kinds: Vec<&str> = m.objects().iter().map(|o| kind(o)).collect();
        let first_other = kinds.iter().position(|k| *k != "Namespace").unwrap();
        assert!(kinds[..first_other].len() >= 2, "{kinds:?}");
        assert!(!kinds[first_other..].contains(&"Namespace"), "{kinds:?}");
        assert!(!kinds.contains(&"Deployment"), "{kinds:?}");
        assert!(kinds.contains(&"ServiceAccount") && kinds.contains(&"ClusterRoleBinding"), "{kinds:?}");
    }

    #[test]
    fn a_replaced_file_must_be_one_kustomization_lists() {
        let m = shipped();
        let err = m.replace_file("nope.yaml", "").unwrap_err();
        assert!(err.to_string().contains("nope.yaml"), "{err}");
    }
}

/// The template Operator's manifests (`fleet-repo-template/operator/**`), keyed by their path in a
/// fleet repo, as a release tag holds them.
pub fn template_operator_files() -> std::collections::BTreeMap<String, Vec<u8>> {
    let root = crate::cluster::checkout_dir().join("fleet-repo-template");
    let mut files = std::collections::BTreeMap::new();
    let mut dirs = vec![root.join("operator")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a readable directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let key = path.strip_prefix(&root).expect("under the template").display().to_string();
                files.insert(key, std::fs::read(&path).expect("a readable template file"));
            }
        }
    }
    files
}
