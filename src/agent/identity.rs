//! The agent's status key: where it lives and how it comes to be. It is supplied as a file
//! (`--status-key`, an unencrypted OpenSSH Ed25519 private key, e.g. a mounted Secret), or else
//! generated on first start into the Secret `fleetgate-status-key-<cluster>` in the agent's own
//! namespace and read from there on every later start. The private half never leaves the spoke;
//! the public half is what `fleetgate agent --print-status-key` prints and `clusters/<name>.yaml`
//! registers as `statusKey`.

use crate::status::{KeyError, StatusSigner};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The key inside the Secret (the `kubernetes.io/ssh-auth` convention).
pub const SECRET_KEY: &str = "ssh-privatekey";

/// `fleetgate-status-key-<cluster>`.
pub fn secret_name(cluster: &str) -> String {
    format!("fleetgate-status-key-{cluster}")
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("reading the status key file {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("status key {origin}")]
    Key { origin: String, source: KeyError },
    #[error(
        "{action} Secret {namespace}/{name} (does the agent's RBAC allow get and create on secrets in its namespace?)"
    )]
    Kube { action: &'static str, namespace: String, name: String, source: Box<kube::Error> },
    #[error("Secret {namespace}/{name} has no {SECRET_KEY} entry; delete it to have a new key generated")]
    Incomplete { namespace: String, name: String },
}

/// The file's key when one is given, else the Secret's, generating and storing one the first time.
pub async fn load_or_create(
    client: &kube::Client,
    namespace: &str,
    cluster: &str,
    file: Option<&Path>,
) -> Result<StatusSigner, IdentityError> {
    if let Some(path) = file {
        let text =
            std::fs::read_to_string(path).map_err(|source| IdentityError::Read { path: path.to_path_buf(), source })?;
        return StatusSigner::from_openssh(&text)
            .map_err(|source| IdentityError::Key { origin: format!("file {}", path.display()), source });
    }
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let name = secret_name(cluster);
    let kube_err = |action, source| IdentityError::Kube {
        action,
        namespace: namespace.to_string(),
        name: name.clone(),
        source: Box::new(source),
    };
    if let Some(secret) = api.get_opt(&name).await.map_err(|e| kube_err("reading", e))? {
        return from_secret(&secret, namespace, &name);
    }
    let signer = StatusSigner::generate(&format!("fleetgate/{cluster}"))
        .map_err(|source| IdentityError::Key { origin: "generation".into(), source })?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(crate::agent::state::CLUSTER_LABEL.to_string(), cluster.to_string())])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/ssh-auth".into()),
        data: Some(BTreeMap::from([(SECRET_KEY.to_string(), ByteString(signer.to_openssh().as_bytes().to_vec()))])),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(secret = %name, key = %signer.public(), "generated this cluster's status key; register it with `fleetgate cluster register`");
            Ok(signer)
        }
        // Another replica created it first: use that one, so both sign with the same key.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let secret = api.get(&name).await.map_err(|e| kube_err("reading", e))?;
            from_secret(&secret, namespace, &name)
        }
        Err(e) => Err(kube_err("creating", e)),
    }
}

fn from_secret(secret: &Secret, namespace: &str, name: &str) -> Result<StatusSigner, IdentityError> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(SECRET_KEY))
        .ok_or_else(|| IdentityError::Incomplete { namespace: namespace.to_string(), name: name.to_string() })?;
    StatusSigner::from_openssh(&String::from_utf8_lossy(&bytes.0))
        .map_err(|source| IdentityError::Key { origin: format!("in Secret {namespace}/{name}"), source })
}
