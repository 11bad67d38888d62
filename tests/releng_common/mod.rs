//! Shared set-up of the release-engineering tests: a real fleet repo (git), a real GnuPG home with
//! a generated key, rendered manifests, and the `fleetgate` binary.

use fleetgate::model::{AdmissionBaseline, ImageRef};
use fleetgate::release::Keyring;
use fleetgate::releng::create::{self, CreateReport, CreateRequest, Targets};
use fleetgate::releng::{FleetRepo, RelengError, Signer};
pub use fleetgate_testenv::git_in;
use fleetgate_testenv::{GitDaemon, GpgHome};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const IMAGE_REPO: &str = "registry.example.com/redis-operator";

pub const FLEET: &str = "\
# The fleet.
apiVersion: fleetgate.io/v1alpha1
kind: Fleet
metadata:
  name: redis-fleet
spec:
  operator:
    name: redis-operator
    namespace: redis-system
  # release: rel-0
  waves: [canary, prod]
";

pub fn cluster_yaml(name: &str, wave: &str) -> String {
    format!(
        "# Cluster {name}.\napiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  wave: {wave}\n  # release: rel-0\n"
    )
}

/// A CRD serving `version` whose `spec` has the given integer fields (`required` are required).
pub fn crd_yaml(version: &str, fields: &[&str], required: &[&str]) -> String {
    let mut spec = String::from("              type: object\n");
    if fields.is_empty() {
        spec.push_str("              properties: {}\n");
    } else {
        spec.push_str("              properties:\n");
        for f in fields {
            spec.push_str(&format!("                {f}: {{type: integer}}\n"));
        }
    }
    if !required.is_empty() {
        spec.push_str(&format!("              required: [{}]\n", required.join(", ")));
    }
    crd_document(version, &spec)
}

/// The RedisCluster CRD serving (and storing) `version`, whose `spec` schema is `spec` (YAML
/// indented for its place under `properties.spec`).
pub fn crd_document(version: &str, spec: &str) -> String {
    format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: redisclusters.cache.example.com
spec:
  group: cache.example.com
  scope: Namespaced
  names: {{plural: redisclusters, singular: rediscluster, kind: RedisCluster, listKind: RedisClusterList}}
  versions:
    - name: {version}
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
{spec}"
    )
}

pub fn deployment_yaml(image: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: redis-operator
  namespace: redis-system
spec:
  selector: {{matchLabels: {{app: redis-operator}}}}
  template:
    metadata: {{labels: {{app: redis-operator}}}}
    spec:
      containers:
        - name: manager
          image: {image}
"
    )
}

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub repo: PathBuf,
    pub gpg: GpgHome,
    pub fpr: String,
    /// The armored public key of `fpr`: what agents trust.
    pub keys: PathBuf,
}

impl Fixture {
    /// A fleet repo on `main` with clusters `cluster-a` (canary), `cluster-b` and `cluster-c`
    /// (prod), one commit, a Git identity; a GnuPG home with one signing key.
    pub fn new() -> Fixture {
        let dir = tempfile::Builder::new().prefix("fg-releng").tempdir().unwrap();
        let repo = dir.path().join("fleet");
        std::fs::create_dir_all(repo.join("clusters")).unwrap();
        git_in(&repo, &["init", "-q", "-b", "main"]);
        git_in(&repo, &["config", "user.name", "Release Engineer"]);
        git_in(&repo, &["config", "user.email", "releng@example.com"]);
        std::fs::write(repo.join("fleet.yaml"), FLEET).unwrap();
        for (c, w) in [("cluster-a", "canary"), ("cluster-b", "prod"), ("cluster-c", "prod")] {
            std::fs::write(repo.join(format!("clusters/{c}.yaml")), cluster_yaml(c, w)).unwrap();
        }
        git_in(&repo, &["add", "-A"]);
        git_in(&repo, &["commit", "-q", "-m", "fleet repo"]);
        let gpg = GpgHome::new().unwrap();
        let fpr = gpg.generate_key("Release Pipeline", "release@example.com").unwrap();
        let keys = gpg.write_public_key(&fpr, &dir.path().join("trusted.asc")).unwrap();
        Fixture { dir, repo, gpg, fpr, keys }
    }

    pub fn git(&self, args: &[&str]) -> String {
        git_in(&self.repo, args)
    }

    /// `git show REV:PATH`.
    pub fn show(&self, rev: &str, path: &str) -> String {
        self.git(&["show", &format!("{rev}:{path}")])
    }

    pub fn open(&self) -> FleetRepo {
        FleetRepo::open(&self.repo).unwrap()
    }

    pub fn signer(&self) -> Signer {
        Signer::open(&self.fpr, Some(self.gpg.path())).unwrap()
    }

    pub fn trust(&self) -> Keyring {
        Keyring::from_files(std::slice::from_ref(&self.keys)).unwrap()
    }

    /// Writes rendered manifests (a CRD and a Deployment) into a fresh folder `name`.
    pub fn manifests(&self, name: &str, tag: &str, crd_version: &str, fields: &[&str], required: &[&str]) -> PathBuf {
        let d = self.dir.path().join(name);
        std::fs::create_dir_all(d.join("crds")).unwrap();
        std::fs::write(d.join("crds/rediscluster.yaml"), crd_yaml(crd_version, fields, required)).unwrap();
        std::fs::write(d.join("deployment.yaml"), deployment_yaml(&format!("{IMAGE_REPO}:{tag}"))).unwrap();
        d
    }

    pub fn request(&self, id: &str, manifests: &Path, tag: &str) -> CreateRequest {
        CreateRequest {
            id: id.to_string(),
            manifests: manifests.to_path_buf(),
            image: ImageRef { repository: IMAGE_REPO.into(), tag: tag.into(), digest: None },
            images: Vec::new(),
            chart_version: "1.2.3".into(),
            chart: None,
            accept_crd_changes: Vec::new(),
            crd_version: "v1alpha2".into(),
            git_commit: "a1b2c3d4e5f6".into(),
            targets: Targets::All,
            rollback_to: None,
            revokes: Vec::new(),
            namespace: None,
            requires: None,
            branch: None,
            admission_baseline: AdmissionBaseline::shipped(),
            allow_admission: None,
            variants: Vec::new(),
        }
    }

    pub fn create(&self, req: &CreateRequest) -> Result<CreateReport, RelengError> {
        create::create(&self.open(), req, &mut self.signer())
    }

    /// Cuts release `id` with image tag `tag` and a compatible CRD (field `size`).
    pub fn release(&self, id: &str, tag: &str) -> CreateReport {
        let m = self.manifests(&format!("render-{id}"), tag, "v1alpha2", &["size"], &[]);
        self.create(&self.request(id, &m, tag)).unwrap()
    }

    /// Runs the `fleetgate` binary in the fixture's directory with `GNUPGHOME` set.
    /// A fixture whose `main` is pushed to `origin`, a bare repo served by the returned daemon.
    pub fn with_origin() -> (Fixture, GitDaemon) {
        let f = Fixture::new();
        let daemon = GitDaemon::start().unwrap();
        let origin = daemon.create_bare("fleet.git").unwrap();
        f.git(&["remote", "add", "origin", &origin]);
        f.git(&["push", "-q", "origin", "main"]);
        (f, daemon)
    }

    pub fn fleetgate(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_fleetgate"))
            .args(args)
            .env("GNUPGHOME", self.gpg.path())
            .env("NO_COLOR", "1")
            .env_remove("FLEETGATE_TRUSTED_KEYS")
            .env_remove("FLEETGATE_SIGN_KEY")
            .current_dir(self.dir.path())
            .output()
            .expect("running fleetgate")
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Parses `-o json` output.
pub fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", stdout(o), stderr(o)))
}
