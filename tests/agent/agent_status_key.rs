//! The agent's own status key against a real API server: `fleetgate agent --print-status-key`
//! generates it on first start into the Secret `fleetgate-status-key-<cluster>` (and prints the
//! same key ever after), and the entries it signs verify with plain OpenSSH
//! (`ssh-keygen -Y verify`, namespace `fleetgate-status`), the way docs/STATUS.md tells a person
//! to check one.

use fleetgate::status::identity::canonical_form;
use fleetgate::status::{STATUS_NAMESPACE, State, Status, StatusKey, StatusSigner};
use fleetgate_testenv::{ClusterOptions, GpgHome, TestCluster};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use std::io::Write;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_fleetgate");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_key_is_generated_once_into_a_secret_and_printed_in_openssh_form() {
    let cluster = TestCluster::start(ClusterOptions::new("status-key")).await.expect("test cluster starts");
    cluster.create_namespace("fleetgate-system").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gpg = GpgHome::new().unwrap();
    let fingerprint = gpg.generate_key("Release Signer", "release@example.com").unwrap();
    let key = gpg.write_public_key(&fingerprint, &dir.path().join("signer.asc")).unwrap();
    let print = || {
        let out = Command::new(BIN)
            .env_remove("FLEETGATE_REPO")
            .args(["agent", "--print-status-key", "--repo", "/unused", "--cluster", "cluster-a", "--kubeconfig"])
            .arg(cluster.kubeconfig_path())
            .arg("--trusted-keys")
            .arg(&key)
            .output()
            .unwrap();
        assert!(out.status.success(), "--print-status-key: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let first = print();
    assert!(first.starts_with("ssh-ed25519 AAAA"), "{first}");
    StatusKey::parse(&first).unwrap();
    assert_eq!(print(), first, "the second start reads the Secret instead of generating");

    let secrets: Api<Secret> = Api::namespaced(cluster.client(), "fleetgate-system");
    let secret = secrets.get("fleetgate-status-key-cluster-a").await.unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/ssh-auth"));
    let private = String::from_utf8(secret.data.unwrap()["ssh-privatekey"].0.clone()).unwrap();
    assert_eq!(StatusSigner::from_openssh(&private).unwrap().public().to_string(), first);
}

/// What docs/STATUS.md tells a person: the canonical form on stdin, the entry's signature, the
/// cluster's key in an allowed_signers file.
fn ssh_keygen_verify(dir: &std::path::Path, key: &StatusKey, entry: &Status, namespace: &str) -> bool {
    let signers = dir.join("allowed_signers");
    std::fs::write(&signers, format!("cluster-a {key}\n")).unwrap();
    let sig = dir.join("entry.sig");
    std::fs::write(&sig, entry.signature.as_deref().unwrap()).unwrap();
    let mut child = Command::new("ssh-keygen")
        .args(["-Y", "verify", "-f"])
        .arg(&signers)
        .args(["-I", "cluster-a", "-n", namespace, "-s"])
        .arg(&sig)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&canonical_form(entry)).unwrap();
    child.wait().unwrap().success()
}

#[test]
fn a_signed_entry_verifies_with_ssh_keygen_and_a_changed_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let signer = StatusSigner::generate("cluster-a").unwrap();
    let mut entry = Status::new("cluster-a", "rel-9", "4f3c9a0d6e1b2c3d4e5f60718293a4b5c6d7e8f9", State::Success, "ok");
    signer.sign(&mut entry, "redis-fleet", 3).unwrap();
    assert!(ssh_keygen_verify(dir.path(), &signer.public(), &entry, STATUS_NAMESPACE));
    assert!(!ssh_keygen_verify(dir.path(), &signer.public(), &entry, "git"), "namespace is checked");
    entry.state = State::Failure;
    assert!(!ssh_keygen_verify(dir.path(), &signer.public(), &entry, STATUS_NAMESPACE));
}
