//! Property-based tests of every parser that reads what a pusher controls: the fleet documents
//! (fleet, cluster, release in both its forms, gate and admission policies), the whole tip
//! configuration as the agent loads it, a release's manifests and their mapping checks, the status
//! note decoder and the cluster status keys. Inputs are the template's own files mutated byte by
//! byte and token by token, arbitrary text, and generated alias bombs. Each property: no panic,
//! and every refusal is a specific error naming the file it read.
//!
//! `make test` runs proptest's default (256 cases a property); `make fuzz` runs
//! `PROPTEST_CASES=20000`. Inputs that once found a bug are kept as plain regression cases at the
//! end of this file.

use fleetgate::manifests::ManifestSet;
use fleetgate::model::{
    ClusterSpec, ConfigError, DirTree, FleetConfig, FleetSpec, GatePolicySpec, MAX_ALIAS_EXPANSION, MAX_YAML_BYTES,
    ParseError, ReleaseAdmissionPolicySpec, parse_document, parse_multi, parse_release,
};
use fleetgate::release::ReleaseFiles;
use fleetgate::release::mapping::check_mapping;
use fleetgate::status::{StatusKey, StatusNote};
use kube::discovery::Scope;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

fn template(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fleet-repo-template").join(path)).unwrap()
}

/// Tokens that tend to change what YAML means: structure, anchors, tags, odd scalars.
const TOKENS: &[&str] = &[
    ":",
    ": ",
    "- ",
    "\n",
    "\n  ",
    "  ",
    "#",
    "&a ",
    "*a",
    "<<: *a",
    "{",
    "}",
    "[",
    "]",
    "'",
    "\"",
    "!!binary ",
    "!!str ",
    "!custom ",
    "~",
    "null",
    "true",
    "1e999",
    "-1",
    "18446744073709551616",
    "0x1F",
    "\t",
    "\0",
    "é",
    "\u{feff}",
    "---\n",
    "...\n",
    "? ",
    "|\n",
    ">-\n",
    "%YAML 1.2\n",
    "apiVersion: v1\n",
    "kind: ConfigMap\n",
];

#[derive(Debug, Clone)]
enum Edit {
    Delete { at: usize, len: usize },
    Insert { at: usize, token: usize },
    Byte { at: usize, byte: u8 },
    Duplicate { at: usize, len: usize },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 1usize..40).prop_map(|(at, len)| Edit::Delete { at, len }),
        (any::<usize>(), 0..TOKENS.len()).prop_map(|(at, token)| Edit::Insert { at, token }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Edit::Byte { at, byte }),
        (any::<usize>(), 1usize..200).prop_map(|(at, len)| Edit::Duplicate { at, len }),
    ]
}

/// The nearest char boundary at or before `at % (len + 1)`.
fn boundary(s: &str, at: usize) -> usize {
    let mut i = at % (s.len() + 1);
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(base: &str, edits: &[Edit]) -> String {
    let mut s = base.to_string();
    for e in edits {
        match *e {
            Edit::Delete { at, len } => {
                let a = boundary(&s, at);
                let b = boundary(&s, a + len.min(s.len() - a));
                s.replace_range(a..b, "");
            }
            Edit::Insert { at, token } => {
                let a = boundary(&s, at);
                s.insert_str(a, TOKENS[token]);
            }
            Edit::Byte { at, byte } => {
                let a = boundary(&s, at);
                s.insert(a, char::from(byte));
            }
            Edit::Duplicate { at, len } => {
                let a = boundary(&s, at);
                let b = boundary(&s, a + len.min(s.len() - a));
                let copy = s[a..b].to_string();
                s.insert_str(b, &copy);
            }
        }
    }
    s
}

/// `base` with up to eight edits.
fn mutated(base: String) -> impl Strategy<Value = String> {
    prop::collection::vec(edit(), 1..8).prop_map(move |edits| apply(&base, &edits))
}

/// A refusal must name the file it read, so a user can find what to fix.
fn names_file(e: &ParseError, file: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(&e.location().file, file);
    prop_assert!(e.to_string().starts_with(file), "{e}");
    Ok(())
}

/// A nest of anchors, each aliasing the one before `width` times: expands to width^depth nodes.
fn alias_bomb() -> impl Strategy<Value = (String, u64)> {
    (2usize..12, 2usize..10).prop_map(|(depth, width)| {
        let mut text = String::from("a0: &a0 [x]\n");
        for d in 1..depth {
            let refs = vec![format!("*a{}", d - 1); width].join(", ");
            text.push_str(&format!("a{d}: &a{d} [{refs}]\n"));
        }
        (text, (width as u64).saturating_pow(depth as u32 - 1))
    })
}

struct Files(BTreeMap<String, Vec<u8>>);

impl ReleaseFiles for Files {
    fn id(&self) -> &str {
        "rel-20250315-001"
    }
    fn files(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.0
    }
    fn default_namespace(&self) -> Option<&str> {
        Some("redis-system")
    }
}

/// Scopes as a cluster serves them for the kinds the template uses.
fn scope_of(group: &str, kind: &str) -> Option<Scope> {
    match (group, kind) {
        ("", "Namespace") | ("apiextensions.k8s.io", _) | ("admissionregistration.k8s.io", _) => Some(Scope::Cluster),
        ("rbac.authorization.k8s.io", "ClusterRole" | "ClusterRoleBinding") => Some(Scope::Cluster),
        ("", _) | ("apps", _) | ("rbac.authorization.k8s.io", _) | ("cache.example.com", _) => Some(Scope::Namespaced),
        _ => None,
    }
}

fn a_status_note() -> String {
    serde_json::json!({
        "schema": 2,
        "context": "fleetgate/cluster-a",
        "entries": [{
            "cluster": "cluster-a", "state": "failure", "description": "p99 420ms > 300ms",
            "release": "rel-2", "commit": "0123456789abcdef0123456789abcdef01234567",
            "reportedAt": "2026-12-01T10:00:00Z", "sequence": 7, "fleet": "redis-fleet",
            "gates": [{"name": "p99", "value": 0.42, "threshold": 0.3}],
            "signature": "AAAA"
        }]
    })
    .to_string()
}

proptest! {
    #[test]
    fn fleet_documents_parse_or_name_their_file(
        fleet in mutated(template("fleet.yaml")),
        cluster in mutated(template("clusters/cluster-a.yaml")),
        gates in mutated(template("policies/gates.yaml")),
        admission in mutated(template("policies/admission.yaml")),
    ) {
        if let Err(e) = parse_document::<FleetSpec>("fleet.yaml", &fleet, "Fleet") { names_file(&e, "fleet.yaml")?; }
        if let Err(e) = parse_document::<ClusterSpec>("clusters/cluster-a.yaml", &cluster, "Cluster") {
            names_file(&e, "clusters/cluster-a.yaml")?;
        }
        if let Err(e) = parse_document::<GatePolicySpec>("policies/gates.yaml", &gates, "GatePolicy") {
            names_file(&e, "policies/gates.yaml")?;
        }
        if let Err(e) = parse_document::<ReleaseAdmissionPolicySpec>("policies/admission.yaml", &admission, "ReleaseAdmissionPolicy") {
            names_file(&e, "policies/admission.yaml")?;
        }
    }

    #[test]
    fn releases_in_both_forms_parse_or_name_their_file(
        release in mutated(template("release.yaml")),
        seed in mutated(SEED_CONFIGMAP.to_string()),
        any_text in "\\PC{0,300}",
    ) {
        for text in [&release, &seed, &any_text] {
            match parse_release("release.yaml", text, Some("registry.example.com/redis-operator")) {
                Ok(r) => prop_assert!(!r.name().is_empty() || text.contains("name")),
                Err(e) => names_file(&e, "release.yaml")?,
            }
        }
    }

    /// The tip configuration the agent loads: one mutated file among the template's; the load
    /// either succeeds or lists findings, each at a file of the repo.
    #[test]
    fn the_tip_configuration_loads_or_lists_findings(
        which in 0usize..4,
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let files = ["fleet.yaml", "clusters/cluster-b.yaml", "policies/gates.yaml", "policies/admission.yaml"];
        let dir = tempfile::tempdir().unwrap();
        for f in ["fleet.yaml", "clusters/cluster-a.yaml", "clusters/cluster-b.yaml", "clusters/cluster-c.yaml", "policies/gates.yaml", "policies/admission.yaml"] {
            let text = if f == files[which] { apply(&template(f), &edits) } else { template(f) };
            let path = dir.path().join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        match FleetConfig::load(&DirTree::new(dir.path())) {
            Ok(_) => {}
            Err(ConfigError::Invalid { findings, .. }) => {
                prop_assert!(!findings.is_empty());
                for f in &findings {
                    prop_assert!(files.iter().chain(["clusters/cluster-a.yaml", "clusters/cluster-c.yaml"].iter()).any(|n| f.at.file == *n), "{f:?}");
                }
            }
            Err(ConfigError::Read(e)) => prop_assert!(false, "a readable tree failed to read: {e}"),
        }
    }

    /// A release's manifests, one file mutated: parsed into a set or refused with errors, and the
    /// mapping checks run over whatever bytes are there without panicking.
    #[test]
    fn manifests_and_mapping_checks_never_panic(
        which in 0usize..9,
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let mut files = fleetgate_testenv::template_operator_files();
        let key = files.keys().nth(which % files.len()).unwrap().clone();
        let text = apply(&String::from_utf8(files[&key].clone()).unwrap(), &edits);
        files.insert(key.clone(), text.into_bytes());
        let release_text = template("release.yaml");
        let release = parse_release("release.yaml", &release_text, None).unwrap();
        let _ = check_mapping(Some("rel-20250315-001"), &release, "release.yaml", &release_text, &files);
        if let Err(e) = ManifestSet::from_release(&Files(files), &scope_of) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn alias_bombs_are_refused_before_they_expand((text, nodes) in alias_bomb()) {
        // The limit counts replayed parser events: a scalar is one, a collection two plus its
        // contents, so what passes expands to fewer nodes than the limit, and what is refused to
        // more than a tenth of it.
        match parse_multi("bomb.yaml", &text) {
            Ok(_) => prop_assert!(nodes <= MAX_ALIAS_EXPANSION, "{nodes} nodes were expanded"),
            Err(e @ ParseError::AliasBomb { .. }) => {
                prop_assert!(nodes > MAX_ALIAS_EXPANSION / 10, "{nodes} nodes");
                names_file(&e, "bomb.yaml")?;
            }
            Err(e) => prop_assert!(false, "not refused as an alias bomb: {e}"),
        }
    }

    /// Status notes: a mutated note decodes or is refused; one that decodes writes back to text
    /// that decodes to the same note (what the agent appends to is what it read).
    #[test]
    fn status_notes_decode_or_refuse_and_round_trip(
        note in mutated(a_status_note()),
        any_text in "\\PC{0,300}",
    ) {
        for text in [&note, &any_text] {
            if let Ok(n) = StatusNote::parse(text) {
                let again = StatusNote::parse(&n.to_text());
                prop_assert!(again.is_ok(), "{:?}", again.err());
                prop_assert_eq!(again.unwrap().to_text(), n.to_text());
            }
        }
    }

    #[test]
    fn status_keys_parse_or_refuse(text in "\\PC{0,200}", key in mutated(STATUS_KEY.to_string())) {
        for t in [&text, &key] {
            if let Err(e) = StatusKey::parse(t) {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}

const SEED_CONFIGMAP: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: release-manifest-rel-20250315-001
data:
  release.id: rel-20250315-001
  git.commit: a1b2c3d4e5f6
  image.tag: v1.2.3
  chart.version: 1.2.3
  crd.version: v1
  target.clusters: cluster-a,cluster-b
  deploy.timestamp: '2025-03-15T10:00:00Z'
  rollback.to: rel-20250310-002
";

const STATUS_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl cluster-a";

#[test]
fn oversized_documents_are_refused_by_size_before_parsing() {
    let big = format!("apiVersion: fleetgate.io/v1alpha1\nkind: Fleet\n#{}\n", "x".repeat(MAX_YAML_BYTES));
    let e = parse_document::<FleetSpec>("fleet.yaml", &big, "Fleet").unwrap_err();
    assert!(matches!(e, ParseError::TooLarge { .. }), "{e}");
}

// The webhook (`POST /hooks/git`): what anyone who reaches the agent's port sends. `judge` is
// the handler's whole decision on a delivery's headers and body.
mod webhook {
    use axum::http::{HeaderMap, HeaderName, HeaderValue};
    use fleetgate::agent::server::{Hook, HookRefused, MAX_BODY_BYTES, WebhookConfig};
    use hmac::{Hmac, Mac};
    use proptest::prelude::*;
    use sha2::Sha256;

    const SECRET: &[u8] = b"s3cret";
    const HEADERS: &[&str] = &[
        "x-hub-signature-256",
        "x-gitea-signature",
        "x-gitlab-token",
        "x-github-event",
        "x-gitea-event",
        "x-gitlab-event",
    ];
    const PUSH: &str = r#"{"ref":"refs/heads/main","before":"0000000000000000000000000000000000000000","after":"1111111111111111111111111111111111111111","repository":{"full_name":"org/fleet"},"commits":[{"id":"1111","message":"promote"}]}"#;

    fn hmac_hex(body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
        mac.update(body);
        mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    fn is_auth(e: &HookRefused) -> bool {
        !matches!(e, HookRefused::NotJson { .. } | HookRefused::TooLarge { .. })
    }

    /// A push payload with its `ref` replaced, bytes flipped and cut: what a forge or an attacker sends.
    fn body() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            ("\\PC{0,40}", any::<usize>(), proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4)).prop_map(
                |(git_ref, cut, flips)| {
                    let mut b = PUSH.replace("refs/heads/main", &git_ref.replace('"', "\\\"")).into_bytes();
                    for (at, byte) in flips {
                        let i = at % b.len();
                        b[i] = byte;
                    }
                    b.truncate(cut % (b.len() + 1));
                    b
                }
            ),
            proptest::collection::vec(any::<u8>(), 0..300),
            Just(Vec::new()),
        ]
    }

    fn header_value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..80),
            "(sha256=)?[0-9a-fA-F+ -]{0,70}".prop_map(String::into_bytes),
            Just(b"ping".to_vec()),
            Just(b"push".to_vec()),
            Just(SECRET.to_vec()),
        ]
    }

    proptest! {
        /// Never a panic; every refusal names its rule; with a secret nothing unsigned passes,
        /// and a correctly signed delivery is never refused for its signature.
        #[test]
        fn deliveries_are_judged_without_panics(
            pairs in proptest::collection::vec((0..HEADERS.len(), header_value()), 0..4),
            body in body(),
            signed in proptest::option::of(0..3usize),
            with_secret in any::<bool>(),
        ) {
            let mut headers = HeaderMap::new();
            for (h, v) in &pairs {
                if let Ok(v) = HeaderValue::from_bytes(v) {
                    headers.insert(HeaderName::from_static(HEADERS[*h]), v);
                }
            }
            if let Some(how) = signed {
                for h in ["x-hub-signature-256", "x-gitea-signature", "x-gitlab-token"] {
                    headers.remove(h);
                }
                let (name, value) = match how {
                    0 => ("x-hub-signature-256", format!("sha256={}", hmac_hex(&body))),
                    1 => ("x-gitea-signature", hmac_hex(&body)),
                    _ => ("x-gitlab-token", String::from_utf8(SECRET.to_vec()).unwrap()),
                };
                headers.insert(HeaderName::from_static(name), value.parse().unwrap());
            }
            let config = WebhookConfig::new("main", with_secret.then(|| SECRET.to_vec()));
            match config.judge(&headers, &body) {
                Ok(Hook::OtherBranch(branch)) => prop_assert_ne!(branch, "main"),
                Ok(_) => {
                    // Accepted with a secret: only the generated valid credential (random ones
                    // do not match a 256-bit HMAC, nor the token unless it is the secret).
                    let token = headers.get("x-gitlab-token").map(|v| v.as_bytes() == SECRET);
                    prop_assert!(!with_secret || signed.is_some() || token == Some(true), "{headers:?}");
                }
                Err(e) => {
                    prop_assert!(!e.to_string().is_empty());
                    prop_assert!(!(signed.is_some() && is_auth(&e)), "a signed delivery refused: {e}");
                    prop_assert!(with_secret || !is_auth(&e), "no secret, yet refused: {e}");
                }
            }
        }

        /// Bodies over the limit are refused by their size, whatever they carry and however signed.
        #[test]
        fn large_bodies_are_refused_by_size(extra in 1usize..4096, fill in any::<u8>(), with_secret in any::<bool>()) {
            let body = vec![fill; MAX_BODY_BYTES + extra];
            let mut headers = HeaderMap::new();
            headers.insert("x-gitea-signature", hmac_hex(&body).parse().unwrap());
            let config = WebhookConfig::new("main", with_secret.then(|| SECRET.to_vec()));
            prop_assert_eq!(config.judge(&headers, &body), Err(HookRefused::TooLarge { limit: MAX_BODY_BYTES }));
        }
    }

    /// Found while writing these properties: `u8::from_str_radix` takes a sign, so `+f` decoded as 0x0f and a
    /// digest written with `+` for a leading `0` passed. Only hex digits are a digest now.
    #[test]
    fn a_signed_digit_is_not_hex() {
        let body = (0..)
            .map(|i: u32| format!("{{\"ref\":\"refs/tags/rel-{i}\"}}"))
            .find(|b| hmac_hex(b.as_bytes()).as_bytes().chunks(2).any(|p| p[0] == b'0'))
            .unwrap();
        let hex = hmac_hex(body.as_bytes());
        let pair = hex.as_bytes().chunks(2).position(|p| p[0] == b'0').unwrap();
        let mut signed = hex.clone().into_bytes();
        signed[pair * 2] = b'+';
        let config = WebhookConfig::new("main", Some(SECRET.to_vec()));
        let mut headers = HeaderMap::new();
        headers.insert("x-gitea-signature", String::from_utf8(signed).unwrap().parse().unwrap());
        assert_eq!(
            config.judge(&headers, body.as_bytes()),
            Err(HookRefused::Malformed { header: "X-Gitea-Signature" })
        );
        headers.insert("x-gitea-signature", hex.parse().unwrap());
        assert_eq!(config.judge(&headers, body.as_bytes()), Ok(Hook::Sync));
    }
}
