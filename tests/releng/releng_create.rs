//! `release create` against a real repository and real GnuPG keys: the tag it signs passes the
//! agent's verification (and `git verify-tag`), a tampered or foreign-signed tag does not, re-runs
//! are idempotent, and each refusal says why.

use crate::releng_common;
use crate::status_support;

use fleetgate::model::{ClusterFacts, ImageRef};
use fleetgate::release::{TagPins, VerifyError, resolve_release, verify};
use fleetgate::releng::create::{CreateOutcome, CreateRequest, VariantInput};
use fleetgate::releng::{Refusal, RelengError, Signer, sign};
use fleetgate::source::Checkout;
use fleetgate::status::State;
use fleetgate_testenv::GitDaemon;
use releng_common::*;

fn agent_verify(f: &Fixture, cluster: &str, id: &str) -> Result<fleetgate::release::VerifiedRelease, VerifyError> {
    let checkout = Checkout::open_local(&f.repo, Some("main")).unwrap();
    let desired = resolve_release(&checkout, cluster, id).unwrap();
    verify(&checkout, &desired, &f.trust(), None, &mut TagPins::in_memory())
}

#[test]
fn the_signed_tag_is_accepted_by_the_agents_verification_and_by_git() {
    let f = Fixture::new();
    let r1 = f.release("rel-1", "v1.0.0");
    assert_eq!(r1.outcome, CreateOutcome::Created);
    assert_eq!(r1.previous, None);
    assert_eq!(f.git(&["rev-parse", "main"]), r1.commit, "main moved to the release commit");
    assert_eq!(f.git(&["cat-file", "-t", "rel-1"]), "tag", "an annotated tag");
    assert_eq!(f.git(&["rev-parse", "rel-1^{commit}"]), r1.commit);

    let verified = agent_verify(&f, "cluster-a", "rel-1").expect("the agent accepts the release");
    assert_eq!(verified.signer(), Some(f.fpr.as_str()));
    assert_eq!(verified.commit(), r1.commit);
    assert_eq!(verified.release().spec.target_clusters, ["cluster-a", "cluster-b", "cluster-c"]);
    assert!(verified.files().contains_key("operator/deployment.yaml"), "{:?}", verified.files().keys());
    assert!(verified.files().contains_key("operator/crds/rediscluster.yaml"));

    // Real git agrees the object is a well-formed signed tag, and the commit is signed too.
    let out = f.gpg.git(&f.repo, &f.fpr).args(["verify-tag", "rel-1"]).output().unwrap();
    assert!(out.status.success(), "git verify-tag: {}", String::from_utf8_lossy(&out.stderr));
    let out = f.gpg.git(&f.repo, &f.fpr).args(["verify-commit", "rel-1^{commit}"]).output().unwrap();
    assert!(out.status.success(), "git verify-commit: {}", String::from_utf8_lossy(&out.stderr));
    // The checked-out work tree followed the branch.
    assert!(f.repo.join("operator/deployment.yaml").exists());
    assert_eq!(f.git(&["status", "--porcelain"]), "");

    // The next release follows the first: previous, default rollback target (rel-1 succeeded on
    // cluster-a), CRD verdict.
    report(&f, "cluster-a", "rel-1", State::Success);
    let r2 = f.release("rel-2", "v1.1.0");
    assert_eq!(r2.previous.as_deref(), Some("rel-1"));
    assert_eq!(r2.mapping.rollback_to.as_deref(), Some("rel-1"));
    assert_eq!(r2.rollback_succeeded_on, ["cluster-a"]);
    assert!(r2.crd_compatibility.compared && r2.crd_compatibility.compatible, "{:?}", r2.crd_compatibility);
    let message = f.git(&["cat-file", "-p", "rel-2"]);
    assert!(
        message.contains(
            "CRD compatibility against rel-1 (last-known-good of cluster-a; the previous release, for cluster-b, \
             cluster-c: no success reported yet): compatible"
        ),
        "{message}"
    );
    assert_eq!(r2.crd_baselines.len(), 1, "{:?}", r2.crd_baselines);
    assert_eq!(
        (r2.crd_baselines[0].last_known_good_of.as_slice(), r2.crd_baselines[0].previous_for.as_slice()),
        (&["cluster-a".to_string()][..], &["cluster-b".to_string(), "cluster-c".to_string()][..])
    );
    assert!(message.contains("image:         registry.example.com/redis-operator:v1.1.0"), "{message}");
    agent_verify(&f, "cluster-b", "rel-2").expect("the second release verifies too");
}

#[test]
fn a_tampered_or_foreign_signed_tag_is_rejected() {
    let f = Fixture::new();
    f.release("rel-1", "v1.0.0");
    let repo = f.open();
    let raw = f.git(&["cat-file", "tag", "rel-1"]) + "\n";

    // Same signature, changed message: the signature no longer matches.
    let tampered = raw.replace("targets:       cluster-a", "targets:       cluster-x");
    assert_ne!(tampered, raw);
    let oid = repo.git().odb().unwrap().write(git2::ObjectType::Tag, tampered.as_bytes()).unwrap();
    repo.git().reference("refs/tags/rel-1", oid, true, "tamper").unwrap();
    match agent_verify(&f, "cluster-a", "rel-1") {
        Err(VerifyError::BadSignature { .. }) => {}
        other => panic!("expected a bad signature, got {other:?}"),
    }

    // A well-formed tag signed by a key the agents do not trust.
    let other_fpr = f.gpg.generate_key("Someone Else", "else@example.com").unwrap();
    let mut stranger = Signer::open(&other_fpr, Some(f.gpg.path())).unwrap();
    let who = repo.git().signature().unwrap();
    let commit = repo.git().refname_to_id("refs/heads/main").unwrap();
    let foreign = sign::write_signed_tag(repo.git(), &mut stranger, commit, "rel-1", &who, "Release rel-1\n").unwrap();
    repo.git().reference("refs/tags/rel-1", foreign, true, "foreign").unwrap();
    match agent_verify(&f, "cluster-a", "rel-1") {
        Err(VerifyError::UntrustedKey { fingerprint, .. }) => assert_eq!(fingerprint, other_fpr),
        other => panic!("expected an untrusted key, got {other:?}"),
    }
}

#[test]
fn re_running_is_idempotent_and_an_id_is_never_reused_for_other_content() {
    let f = Fixture::new();
    let m = f.manifests("render", "v1.0.0", "v1alpha2", &["size"], &[]);
    let req = f.request("rel-1", &m, "v1.0.0");
    let first = f.create(&req).unwrap();
    let again = f.create(&req).unwrap();
    assert_eq!(again.outcome, CreateOutcome::AlreadyReleased);
    assert_eq!(again.commit, first.commit);
    assert_eq!(again.tag, first.tag);
    assert_eq!(f.git(&["rev-list", "--count", "main"]), "2", "no second commit");

    // Another release on top does not change what rel-1 means, and rel-1 still re-runs clean.
    f.release("rel-2", "v1.1.0");
    assert_eq!(f.create(&req).unwrap().outcome, CreateOutcome::AlreadyReleased);

    let mut other = req.clone();
    other.image.tag = "v9.9.9".into();
    std::fs::write(m.join("deployment.yaml"), deployment_yaml(&format!("{IMAGE_REPO}:v9.9.9"))).unwrap();
    match f.create(&other) {
        Err(RelengError::Refused(Refusal::IdReused { id, differences })) => {
            assert_eq!(id, "rel-1");
            assert!(differences.contains("operator/ manifests differ"), "{differences}");
            assert!(
                differences.contains(
                    "image registry.example.com/redis-operator:v1.0.0 vs registry.example.com/redis-operator:v9.9.9"
                ),
                "{differences}"
            );
        }
        other => panic!("expected id-reused, got {other:?}"),
    }
}

/// A CRD whose spec embeds a pod template: `containers` and `initContainers` items with the
/// given fields, besides the spec fields `spec` (`required` among them required).
fn template_crd(container_fields: &[&str], spec: &[&str], required: &[&str]) -> String {
    let item: String =
        container_fields.iter().map(|f| format!("                              {f}: {{type: string}}\n")).collect();
    let list = |name: &str| {
        format!(
            "                        {name}:\n                          type: array\n                          items:\n                            type: object\n                            properties:\n{item}"
        )
    };
    let fields: String = spec.iter().map(|f| format!("                {f}: {{type: integer}}\n")).collect();
    let required = if required.is_empty() {
        String::new()
    } else {
        format!("              required: [{}]\n", required.join(", "))
    };
    let spec = format!(
        "              type: object
{required}              properties:
{fields}                template:
                  type: object
                  properties:
                    spec:
                      type: object
                      properties:
{}{}",
        list("containers"),
        list("initContainers")
    );
    crd_document("v1alpha2", &spec)
}

/// `fleetgate release create` of `id` from `manifests` at image tag `tag`, signed, for all clusters.
fn create_args(f: &Fixture, id: &str, manifests: &str, tag: &str) -> Vec<String> {
    let image = format!("{IMAGE_REPO}:{tag}");
    [
        "release",
        "create",
        "--repo",
        "fleet",
        "--id",
        id,
        "--manifests",
        manifests,
        "--image",
        &image,
        "--chart-version",
        "1.2.3",
        "--crd-version",
        "v1alpha2",
        "--git-commit",
        "a1b2c3d4e5f6",
        "--all",
        "--sign-key",
        &f.fpr,
    ]
    .map(String::from)
    .to_vec()
}

/// The values of the `--accept-crd-change` flags a refusal prints (single-quoted ones unquoted).
fn printed_acceptances(text: &str) -> Vec<String> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("--accept-crd-change "))
        .unwrap_or_else(|| panic!("no flags in {text}"));
    line.split("--accept-crd-change ")
        .map(|v| v.trim().trim_matches('\'').to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The refusal of an incompatible change leads somewhere: it prints the flags that accept what it
/// found, compacted (one per rule and subtree), and passing exactly those signs them into
/// release.yaml, where the agents' CRD gate reads them.
#[test]
fn an_incompatible_change_is_refused_with_the_flags_that_accept_it_and_those_flags_release_it() {
    let f = Fixture::new();
    let render = |name: &str, crd: String, tag: &str| {
        let d = f.dir.path().join(name);
        std::fs::create_dir_all(d.join("crds")).unwrap();
        std::fs::write(d.join("crds/rediscluster.yaml"), crd).unwrap();
        std::fs::write(d.join("deployment.yaml"), deployment_yaml(&format!("{IMAGE_REPO}:{tag}"))).unwrap();
        d.to_str().unwrap().to_string()
    };
    let m1 = render("render-1", template_crd(&["name", "image", "legacyProbe"], &["size", "replicas"], &[]), "v1.0.0");
    // rel-2 drops legacyProbe from both container lists and spec.replicas, and requires shards.
    let m2 = render("render-2", template_crd(&["name", "image"], &["size", "shards"], &["shards"]), "v1.1.0");
    let cut = |id: &str, dir: &str, tag: &str, extra: &[String]| {
        let mut args = create_args(&f, id, dir, tag);
        args.extend(extra.iter().cloned());
        f.fleetgate(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let out = cut("rel-1", &m1, "v1.0.0", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let tip = f.git(&["rev-parse", "main"]);

    let out = cut("rel-2", &m2, "v1.1.0", &[]);
    assert_eq!(out.status.code(), Some(1), "refused: {}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.starts_with("refused: CRDs are incompatible with rel-1 (the previous release, for cluster-a, cluster-b, cluster-c: no success reported yet):"),
        "{text}"
    );
    assert!(text.contains(".spec.template.spec.initContainers[*].legacyProbe: field removed"), "{text}");
    assert!(!text.contains("--allow-incompatible-crds"), "{text}");
    let accept = printed_acceptances(&text);
    let crd = "redisclusters.cache.example.com";
    assert_eq!(
        accept,
        [
            format!("field-removed:{crd}:.spec.replicas"),
            format!("field-removed:{crd}:.spec.template.spec"),
            format!("required-added:{crd}:.spec.shards"),
        ],
        "one flag per rule and subtree, not one per container list: {text}"
    );
    assert_eq!(f.git(&["rev-parse", "main"]), tip, "nothing was committed");
    assert!(f.git(&["tag", "-l", "rel-2"]).is_empty(), "nothing was tagged");
    // Pipelines get the same values.
    let out = cut("rel-2", &m2, "v1.1.0", &["-o".into(), "json".into()]);
    let j = json(&out);
    assert_eq!((j["result"].as_str(), j["code"].as_str()), (Some("refused"), Some("incompatible-crds")));
    assert_eq!(j["details"]["accept"], serde_json::json!(accept));

    // Exactly the printed flags, passed back: released, and the acceptances are signed content.
    let flags: Vec<String> = accept.iter().flat_map(|a| ["--accept-crd-change".to_string(), a.clone()]).collect();
    let out = cut("rel-2", &m2, "v1.1.0", &flags);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let shown = stdout(&out);
    assert!(shown.contains("CRDs       compatible with rel-1"), "{shown}");
    assert!(
        shown.contains(&format!("accepts field-removed:{crd}:.spec.template.spec (signed as spec.acceptCrdChanges)")),
        "{shown}"
    );
    let verified = agent_verify(&f, "cluster-a", "rel-2").expect("the agent accepts the release");
    assert_eq!(verified.release().spec.accept_crd_changes, accept);
    // What the agent's pre-apply gate runs against a cluster that runs rel-1: nothing blocks.
    let crds = |rev: &str| {
        let files: std::collections::BTreeMap<String, Vec<u8>> =
            [("crd.yaml".to_string(), f.show(rev, "operator/crds/rediscluster.yaml").into_bytes())].into();
        fleetgate::manifests::crds_in_files(&files).unwrap().into_iter().map(|c| c.crd).collect::<Vec<_>>()
    };
    let signed =
        fleetgate::gates::crd_compat::Acceptance::parse_all(&verified.release().spec.accept_crd_changes).unwrap();
    let (old, new) = (crds("rel-1"), crds("rel-2"));
    assert!(!fleetgate::gates::crd_compat::check_all(&old, &new).is_empty(), "the change is breaking");
    let findings = fleetgate::gates::crd_compat::check_all_with(&old, &new, &signed);
    assert!(fleetgate::gates::crd_compat::is_compatible(&findings), "{findings:?}");
}

/// The baseline is what the target clusters last ran successfully, not the previous tag: rel-2
/// dropped a field on purpose but never ran anywhere, so rel-3 (the same CRD) is judged against
/// rel-1, which cluster-a and cluster-b run — and against rel-2 only for cluster-c, which
/// reported nothing yet.
#[test]
fn crds_are_compared_with_the_last_known_good_releases_of_the_targets() {
    let f = Fixture::new();
    let m1 = f.manifests("render-1", "v1.0.0", "v1alpha2", &["size", "legacy"], &[]);
    f.create(&f.request("rel-1", &m1, "v1.0.0")).unwrap();
    report(&f, "cluster-a", "rel-1", State::Success);
    report(&f, "cluster-b", "rel-1", State::Success);
    let m2 = f.manifests("render-2", "v1.1.0", "v1alpha2", &["size"], &[]);
    let accepted = CreateRequest {
        accept_crd_changes: vec!["field-removed:.spec.legacy".into()],
        ..f.request("rel-2", &m2, "v1.1.0")
    };
    f.create(&accepted).unwrap();
    report(&f, "cluster-a", "rel-2", State::Failure);

    let m3 = f.manifests("render-3", "v1.2.0", "v1alpha2", &["size"], &[]);
    let base = create_args(&f, "rel-3", m3.to_str().unwrap(), "v1.2.0");
    let base: Vec<&str> = base.iter().map(String::as_str).collect();
    let out = f.fleetgate(&base);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stderr(&out);
    assert!(
        text.starts_with("refused: CRDs are incompatible with rel-1 (last-known-good of cluster-a, cluster-b):\n  - redisclusters.cache.example.com v1alpha2 .spec.legacy: field removed"),
        "judged against what runs, not against rel-2: {text}"
    );
    assert_eq!(printed_acceptances(&text), ["field-removed:redisclusters.cache.example.com:.spec.legacy"]);

    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--accept-crd-change", "field-removed:redisclusters.cache.example.com:.spec.legacy"])
        .collect();
    let out = f.fleetgate(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let shown = stdout(&out);
    assert!(shown.contains("  baseline   rel-1 (last-known-good of cluster-a, cluster-b): compatible\n"), "{shown}");
    assert!(
        shown.contains(
            "  baseline   rel-2 (the previous release, for cluster-c: no success reported yet): compatible\n"
        ),
        "{shown}"
    );
    assert!(shown.contains("  CRDs       compatible with rel-1, rel-2\n"), "{shown}");
    let message = f.git(&["cat-file", "-p", "rel-3"]);
    assert!(
        message.contains("CRD compatibility against rel-1 (last-known-good of cluster-a, cluster-b), rel-2 ("),
        "{message}"
    );

    let mut json_args = args.clone();
    json_args.extend(["-o", "json"]);
    let j = json(&f.fleetgate(&json_args));
    assert_eq!(j["outcome"], "already-released");
    assert_eq!(j["crdBaselines"][0]["release"], "rel-1");
    assert_eq!(j["crdBaselines"][0]["lastKnownGoodOf"], serde_json::json!(["cluster-a", "cluster-b"]));
    assert_eq!(j["crdBaselines"][1]["release"], "rel-2");
    assert_eq!(j["crdBaselines"][1]["previousFor"], serde_json::json!(["cluster-c"]));
}

#[test]
fn a_release_that_accepts_exactly_its_breaking_changes_is_created_and_validates() {
    let f = Fixture::new();
    let m1 = f.manifests("render-1", "v1.0.0", "v1alpha2", &["size", "replicas"], &[]);
    f.create(&f.request("rel-1", &m1, "v1.0.0")).unwrap();
    let m2 = f.manifests("render-2", "v1.1.0", "v1alpha2", &["size", "shards"], &["shards"]);

    // Accepting only one of the two breaking changes is not enough.
    let mut half = f.request("rel-2", &m2, "v1.1.0");
    half.accept_crd_changes = vec!["field-removed:.spec.replicas".into()];
    match f.create(&half) {
        Err(RelengError::Refused(Refusal::IncompatibleCrds { findings, .. })) => {
            let text = findings.join("\n");
            assert!(text.contains(".spec.shards") && !text.contains(".spec.replicas"), "{text}");
        }
        other => panic!("expected incompatible-crds, got {other:?}"),
    }

    let mut req = half.clone();
    req.accept_crd_changes.push("required-added:.spec.shards".into());
    let r = f.create(&req).unwrap();
    assert!(r.crd_compatibility.compatible, "{:?}", r.crd_compatibility);
    let release = f.git(&["show", "rel-2:release.yaml"]);
    assert!(release.contains("acceptCrdChanges:") && release.contains("required-added:.spec.shards"), "{release}");
    // The per-CRD versions were recorded, and `validate` agrees with the signed acceptances.
    assert!(release.contains("crds:") && release.contains("storage: v1alpha2"), "{release}");
    let keys = f.keys.to_string_lossy().into_owned();
    let out = f.fleetgate(&["validate", "--repo", "fleet", "--trusted-keys", &keys]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn a_bad_acceptance_is_refused_before_anything_is_written() {
    let f = Fixture::new();
    let m1 = f.manifests("render-1", "v1.0.0", "v1alpha2", &["size"], &[]);
    f.create(&f.request("rel-1", &m1, "v1.0.0")).unwrap();
    let m2 = f.manifests("render-2", "v1.1.0", "v1alpha2", &["size"], &[]);
    let mut req = f.request("rel-2", &m2, "v1.1.0");
    req.accept_crd_changes = vec!["no-such-rule".into()];
    let err = f.create(&req).unwrap_err().to_string();
    assert!(err.contains("spec.acceptCrdChanges") && err.contains("no-such-rule"), "{err}");
    assert!(f.git(&["tag", "-l", "rel-2"]).is_empty());
}

#[test]
fn a_mapping_that_disagrees_with_the_manifests_is_refused() {
    let f = Fixture::new();
    let m = f.manifests("render", "v1.0.0", "v1alpha2", &["size"], &[]);
    let mut req = f.request("rel-1", &m, "v2.0.0");
    match f.create(&req) {
        Err(RelengError::Refused(Refusal::MappingInconsistent { findings })) => {
            assert!(findings.iter().any(|x| x.contains("v1.0.0") && x.contains("v2.0.0")), "{findings:?}");
        }
        other => panic!("expected mapping-inconsistent, got {other:?}"),
    }
    req.image.tag = "v1.0.0".into();
    req.crd_version = "v1beta1".into();
    match f.create(&req) {
        Err(RelengError::Refused(Refusal::MappingInconsistent { findings })) => {
            assert!(findings.iter().any(|x| x.contains("v1beta1")), "{findings:?}");
        }
        other => panic!("expected mapping-inconsistent, got {other:?}"),
    }
    assert!(f.git(&["tag", "-l"]).is_empty());
}

#[test]
fn the_command_line_reports_for_people_and_pipelines_with_exit_codes() {
    let f = Fixture::new();
    let m = f.manifests("render", "v1.0.0", "v1alpha2", &["size"], &[]);
    let m = m.to_str().unwrap();
    let base = ["release", "create", "--repo", "fleet", "--id", "rel-1", "--manifests", m, "--chart-version", "1.2.3"];
    let rest = [
        "--crd-version",
        "v1alpha2",
        "--git-commit",
        "a1b2c3d4e5f6",
        "--targets",
        "cluster-a,cluster-b",
        "--sign-key",
        &f.fpr,
    ];
    let run = |image: &str, extra: &[&str]| {
        let args: Vec<&str> =
            base.iter().chain(["--image", image].iter()).chain(rest.iter()).chain(extra.iter()).copied().collect();
        f.fleetgate(&args)
    };
    let image = format!("{IMAGE_REPO}:v1.0.0");

    let out = run(&image, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("Released rel-1 on branch main"), "{text}");
    assert!(text.contains("targets    cluster-a, cluster-b"), "{text}");
    assert!(text.contains("CRDs       nothing to compare with (first release)"), "{text}");
    assert!(
        text.contains("Next: fleetgate promote rel-1 --wave canary --repo fleet --trusted-keys KEYS.asc\n"),
        "{text}"
    );

    let out = run(&image, &["-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let j = json(&out);
    assert_eq!(j["result"], "done");
    assert_eq!(j["outcome"], "already-released");
    assert_eq!(j["signer"], f.fpr.as_str());
    assert_eq!(j["mapping"]["targetClusters"], serde_json::json!(["cluster-a", "cluster-b"]));

    let out = run(&format!("{IMAGE_REPO}:v1.0.1"), &["-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "a refusal exits 1");
    let j = json(&out);
    assert_eq!(j["result"], "refused");
    assert_eq!(j["code"], "id-reused");

    let out = run(&format!("{IMAGE_REPO}:v1.0.1"), &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("refused: release id rel-1 is already tagged with different content"),
        "{}",
        stderr(&out)
    );

    let out = run("no-tag-here", &[]);
    assert_eq!(out.status.code(), Some(2), "a usage error exits 2");
    assert!(stderr(&out).contains("--image \"no-tag-here\": no tag"), "{}", stderr(&out));

    let out = f.fleetgate(&["release", "create", "--repo", "fleet", "--id", "rel-2"]);
    assert_eq!(out.status.code(), Some(2), "missing flags are a usage error");
}

#[test]
fn push_sends_the_branch_and_the_signed_tag() {
    let f = Fixture::new();
    let daemon = GitDaemon::start().unwrap();
    let url = daemon.create_bare("fleet.git").unwrap();
    f.git(&["remote", "add", "origin", &url]);
    f.git(&["push", "-q", "origin", "main"]);
    let m = f.manifests("render", "v1.0.0", "v1alpha2", &["size"], &[]);
    let out = f.fleetgate(&[
        "release",
        "create",
        "--repo",
        "fleet",
        "--id",
        "rel-1",
        "--manifests",
        m.to_str().unwrap(),
        "--image",
        &format!("{IMAGE_REPO}:v1.0.0"),
        "--chart-version",
        "1.2.3",
        "--crd-version",
        "v1alpha2",
        "--git-commit",
        "a1b2c3d4e5f6",
        "--all",
        "--sign-key",
        &f.fpr,
        "--push",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("pushed     refs/heads/main, refs/tags/rel-1 to origin"), "{}", stdout(&out));
    let remote = daemon.path("fleet.git");
    assert_eq!(git_in(&remote, &["rev-parse", "main"]), f.git(&["rev-parse", "main"]));
    assert_eq!(git_in(&remote, &["cat-file", "-t", "rel-1"]), "tag");
    assert_eq!(git_in(&remote, &["rev-parse", "rel-1"]), f.git(&["rev-parse", "rel-1"]));
}

#[test]
fn local_changes_stop_the_release_except_manifests_rendered_into_the_repo() {
    let f = Fixture::new();
    std::fs::write(f.repo.join("fleet.yaml"), format!("{FLEET}# local edit\n")).unwrap();
    let m = f.manifests("render", "v1.0.0", "v1alpha2", &["size"], &[]);
    match f.create(&f.request("rel-1", &m, "v1.0.0")) {
        Err(e @ RelengError::DirtyWorktree { .. }) => {
            assert_eq!(e.to_string(), "the work tree has uncommitted changes to fleet.yaml; commit or stash them first")
        }
        other => panic!("expected a dirty work tree, got {other:?}"),
    }
    f.git(&["checkout", "--", "fleet.yaml"]);

    // A pipeline that renders straight into the repo's operator/ folder.
    let inside = f.repo.join("operator");
    std::fs::create_dir_all(inside.join("crds")).unwrap();
    std::fs::write(inside.join("crds/rediscluster.yaml"), crd_yaml("v1alpha2", &["size"], &[])).unwrap();
    std::fs::write(inside.join("deployment.yaml"), deployment_yaml(&format!("{IMAGE_REPO}:v1.0.0"))).unwrap();
    let r = f.create(&f.request("rel-1", &inside, "v1.0.0")).unwrap();
    assert_eq!(r.manifest_files, 2);
    assert_eq!(f.git(&["status", "--porcelain"]), "", "the rendered files are now committed");
    assert_eq!(
        f.show("rel-1", "operator/deployment.yaml"),
        deployment_yaml(&format!("{IMAGE_REPO}:v1.0.0")).trim_end()
    );
}

/// Releases are numbered in signed content. The default rollback target is the newest earlier
/// release some cluster reported `success` for: never one that only failed (or never ran), never
/// a revoked one; with none, no target (each agent returns to its last-known-good). Re-cutting a
/// release keeps its number and target even after statuses moved on.
#[test]
fn sequences_count_up_and_the_default_rollback_is_the_newest_success_not_revoked() {
    let f = Fixture::new();
    let r1 = f.release("rel-1", "v1.0.0");
    assert_eq!((r1.mapping.sequence, r1.mapping.rollback_to.as_deref()), (Some(1), None));
    let r2 = f.release("rel-2", "v1.1.0");
    assert_eq!((r2.mapping.sequence, r2.mapping.rollback_to.as_deref()), (Some(2), None), "nothing succeeded yet");

    // The canary halted rel-2; rel-1 runs on cluster-a and cluster-b.
    report(&f, "cluster-b", "rel-1", State::Success);
    report(&f, "cluster-a", "rel-1", State::Success);
    report(&f, "cluster-a", "rel-2", State::Failure);
    let r3 = f.release("rel-3", "v1.2.0");
    assert_eq!((r3.mapping.sequence, r3.mapping.rollback_to.as_deref()), (Some(3), Some("rel-1")));
    assert_eq!(r3.rollback_succeeded_on, ["cluster-a", "cluster-b"]);

    // rel-3 succeeds somewhere; rel-4 withdraws it, so its undo skips it.
    report(&f, "cluster-b", "rel-3", State::Success);
    let m = f.manifests("render-rel-4", "v1.3.0", "v1alpha2", &["size"], &[]);
    let req = CreateRequest { revokes: vec!["rel-3".into()], ..f.request("rel-4", &m, "v1.3.0") };
    let r4 = f.create(&req).unwrap();
    assert_eq!((r4.mapping.sequence, r4.mapping.rollback_to.as_deref()), (Some(4), Some("rel-1")));
    assert_eq!(r4.mapping.revokes, ["rel-3"]);

    // Statuses move on; cutting rel-2 or rel-4 again yields the same documents.
    report(&f, "cluster-b", "rel-2", State::Success);
    assert_eq!(f.create(&req).unwrap().outcome, CreateOutcome::AlreadyReleased);
    let m2 = f.manifests("render-rel-2", "v1.1.0", "v1alpha2", &["size"], &[]);
    assert_eq!(f.create(&f.request("rel-2", &m2, "v1.1.0")).unwrap().outcome, CreateOutcome::AlreadyReleased);

    let unknown = CreateRequest { revokes: vec!["rel-9".into()], ..f.request("rel-5", &m, "v1.3.0") };
    assert!(matches!(f.create(&unknown), Err(RelengError::UnknownRelease(id)) if id == "rel-9"));
}

/// `cluster`'s status for release `id`, as its agent writes it ([`status_support::report`]).
fn report(f: &Fixture, cluster: &str, id: &str, state: State) {
    status_support::report(&f.repo, cluster, id, state);
}

/// Manifests that break four admission rules: a ConfigMap outside `allowedNamespaces`, a
/// ClusterRole with a wildcard and `nodes/proxy` in different rules, a privileged pod, and a
/// cluster-scoped kind `allowedClusterScopedKinds` does not list.
fn render_inadmissible(f: &Fixture, tag: &str) -> String {
    let d = f.dir.path().join("render-inadmissible");
    std::fs::create_dir_all(d.join("crds")).unwrap();
    std::fs::write(d.join("crds/rediscluster.yaml"), crd_yaml("v1alpha2", &["size"], &[])).unwrap();
    let deployment = deployment_yaml(&format!("{IMAGE_REPO}:{tag}"))
        .replace("          image:", "          securityContext: {privileged: true}\n          image:");
    std::fs::write(d.join("deployment.yaml"), deployment).unwrap();
    std::fs::write(
        d.join("extra.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: other-team}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: redis-operator}\nrules:\n\
         - {apiGroups: ['*'], resources: [pods], verbs: [get]}\n\
         - {apiGroups: [''], resources: [nodes/proxy], verbs: [get]}\n---\n\
         apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: redis-critical}\nvalue: 1000000\n",
    )
    .unwrap();
    d.to_str().unwrap().to_string()
}

/// The `spec:` lines a refusal prints for the policy whose heading contains `policy`.
fn printed_lines(text: &str, policy: &str) -> Vec<String> {
    let mut lines = text.lines().skip_while(|l| !(l.starts_with("  in ") && l.contains(policy)));
    assert!(lines.next().is_some(), "no lines for {policy} in {text}");
    lines.take_while(|l| l.starts_with("    ")).map(|l| l.trim().to_string()).collect()
}

/// `spec` of the ReleaseAdmissionPolicy `file` with each of `lines` (a whole field) set.
fn set_spec_fields(file: &std::path::Path, lines: &[String]) {
    let mut doc: serde_json::Value = serde_saphyr::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let fields: serde_json::Map<String, serde_json::Value> = serde_saphyr::from_str(&lines.join("\n")).unwrap();
    let spec = doc["spec"].as_object_mut().unwrap();
    spec.extend(fields);
    std::fs::write(file, serde_saphyr::to_string(&doc).unwrap()).unwrap();
}

/// One `release create` of manifests that break four admission rules reports every rule and
/// every refused grant, the policy lines that would admit them and the files they go in, and
/// writes nothing; `--allow-admission REASON` signs anyway and records why; and the printed lines,
/// added to the baseline (`--admission-policy`) and the repo's policy, admit the release.
#[test]
fn admission_refuses_before_signing_with_every_violation_and_the_lines_that_admit_them() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.repo.join("policies")).unwrap();
    let repo_policy = f.repo.join("policies/operator.yaml");
    std::fs::write(
        &repo_policy,
        "apiVersion: fleetgate.io/v1alpha1\nkind: ReleaseAdmissionPolicy\nmetadata: {name: operator}\nspec: {podSecurity: baseline}\n",
    )
    .unwrap();
    f.git(&["add", "-A"]);
    f.git(&["commit", "-q", "-m", "the repo's admission policy"]);
    let manifests = render_inadmissible(&f, "v1.0.0");
    let cut = |id: &str, extra: &[&str]| {
        let mut args = create_args(&f, id, &manifests, "v1.0.0");
        args.extend(extra.iter().map(|s| s.to_string()));
        f.fleetgate(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let tip = f.git(&["rev-parse", "main"]);

    let out = cut("rel-1", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stderr(&out);
    for expected in [
        "ConfigMap other-team/settings (operator/extra.yaml (document 1)):\n    - namespace other-team is not in allowedNamespaces — refused by agent baseline",
        "ClusterRole.rbac.authorization.k8s.io redis-operator (operator/extra.yaml (document 2)):",
        "rules[0] grants apiGroups: [*] and allowedRbac does not list wildcard — refused by agent baseline",
        "rules[1] grants nodes/proxy and allowedRbac does not list nodesProxy — refused by agent baseline, ReleaseAdmissionPolicy operator",
        "securityContext.privileged is true, which Pod Security level baseline forbids — refused by agent baseline, ReleaseAdmissionPolicy operator",
        "cluster-scoped kind PriorityClass.scheduling.k8s.io is not in allowedClusterScopedKinds — refused by agent baseline",
        "in the agents' baseline: deploy/config.yaml",
        "in policies/operator.yaml (ReleaseAdmissionPolicy operator):",
        "--allow-admission REASON",
    ] {
        assert!(text.contains(expected), "«{expected}» not in:\n{text}");
    }
    let baseline_lines = printed_lines(&text, "agents' baseline");
    assert_eq!(
        baseline_lines,
        [
            "allowedNamespaces: [redis-system, other-team]",
            "allowedClusterScopedKinds: [CustomResourceDefinition.apiextensions.k8s.io, ClusterRole.rbac.authorization.k8s.io, \
             ClusterRoleBinding.rbac.authorization.k8s.io, ValidatingWebhookConfiguration.admissionregistration.k8s.io, \
             MutatingWebhookConfiguration.admissionregistration.k8s.io, PriorityClass.scheduling.k8s.io]",
            // The baseline's own clusterPods stays: each line replaces the whole field.
            "allowedRbac: [clusterPods, wildcard, nodesProxy]",
            "podSecurity: privileged",
        ]
    );
    // A repo policy silent on allowedRbac keeps its default (none): it must repeat the grants.
    let repo_lines = printed_lines(&text, "policies/operator.yaml");
    assert_eq!(repo_lines, ["allowedRbac: [wildcard, nodesProxy]", "podSecurity: privileged"]);
    assert_eq!(f.git(&["rev-parse", "main"]), tip, "nothing was committed");
    assert!(f.git(&["tag", "-l"]).is_empty(), "nothing was tagged");
    let j = json(&cut("rel-1", &["-o", "json"]));
    assert_eq!((j["result"].as_str(), j["code"].as_str()), (Some("refused"), Some("admission")));
    assert_eq!(j["details"]["objects"].as_array().unwrap().len(), 4, "{j:#}");

    // The option the refusal names signs anyway, and the signed tag says why and what.
    let out = cut("rel-1", &["--allow-admission", "node debugging spike, approved in CHG-42"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("admission  REFUSED, signed anyway (--allow-admission): node debugging spike"));
    let message = f.git(&["cat-file", "-p", "rel-1"]);
    assert!(
        message
            .contains("Admission refused, signed anyway (--allow-admission): node debugging spike, approved in CHG-42"),
        "{message}"
    );
    assert!(message.contains("rules[1] grants nodes/proxy"), "{message}");
    agent_verify(&f, "cluster-a", "rel-1").expect("a valid signed release");

    // The printed lines, in the files they name: admitted without an override.
    let baseline = f.dir.path().join("baseline.yaml");
    let shipped = fleetgate::model::AdmissionBaseline::shipped().spec;
    let doc = fleetgate::model::Document::new("ReleaseAdmissionPolicy", "spoke-baseline", shipped);
    std::fs::write(&baseline, serde_saphyr::to_string(&doc).unwrap()).unwrap();
    set_spec_fields(&baseline, &baseline_lines);
    set_spec_fields(&repo_policy, &repo_lines);
    f.git(&["commit", "-q", "-am", "admit the operator's needs"]);
    let out = cut("rel-2", &["--admission-policy", baseline.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("admission  admitted"), "{}", stdout(&out));
    assert!(!f.git(&["cat-file", "-p", "rel-2"]).contains("--allow-admission"));
}

/// Variant `name` for [`variants_are_signed_with_the_release_one_id_one_sequence_and_refused_when_crds_differ_or_a_selector_is_invalid`]:
/// the fixture's manifests at image `<name>.registry.example.com/redis-operator:v1.0.0`, the CRD
/// with `fields`.
fn variant(f: &Fixture, name: &str, fields: &[&str], selector: Option<&str>) -> VariantInput {
    let dir = f.manifests(&format!("render-{name}"), "v1.0.0", "v1alpha2", fields, &[]);
    let repository = format!("{name}.registry.example.com/redis-operator");
    std::fs::write(dir.join("deployment.yaml"), deployment_yaml(&format!("{repository}:v1.0.0"))).unwrap();
    VariantInput {
        name: name.into(),
        source: dir,
        selector: selector.map(|s| serde_saphyr::from_str(s).unwrap()),
        image: Some(ImageRef { repository, tag: "v1.0.0".into(), digest: None }),
        images: Vec::new(),
        platforms: Default::default(),
    }
}

#[test]
fn variants_are_signed_with_the_release_one_id_one_sequence_and_refused_when_crds_differ_or_a_selector_is_invalid() {
    let f = Fixture::new();
    let base = f.manifests("render", "v1.0.0", "v1alpha2", &["size"], &[]);
    let with = |variants: Vec<VariantInput>| CreateRequest { variants, ..f.request("rel-1", &base, "v1.0.0") };
    let refused = |req: &CreateRequest| match f.create(req) {
        Err(RelengError::Refused(Refusal::MappingInconsistent { findings })) => findings,
        other => panic!("expected a refusal, got {other:?}"),
    };

    // A variant whose CRD has another schema: one cluster-wide definition cannot be two.
    let findings = refused(&with(vec![variant(&f, "eu", &["size", "shards"], Some("{matchLabels: {region: eu}}"))]));
    assert!(
        findings.iter().any(|x| x.contains(
            "CRD redisclusters.cache.example.com differs between the base rendering (operator/) and variant eu"
        )),
        "{findings:?}"
    );
    // A selector no agent could be matched against, and a default that is not last.
    let findings = refused(&with(vec![
        variant(&f, "new", &["size"], Some("{kubernetes: newest}")),
        variant(&f, "all", &["size"], None),
        variant(&f, "eu", &["size"], Some("{matchLabels: {region: eu}}")),
    ]));
    let said = findings.join("\n");
    assert!(said.contains("variant new: requires.kubernetes \"newest\" is not a version range"), "{said}");
    assert!(said.contains("variant all has no selector but is not the last variant"), "{said}");
    assert!(f.git(&["tag", "-l"]).is_empty(), "nothing is tagged when a variant is refused");

    // Two good variants: one tag, one sequence, each variant's manifests in the signed tree.
    let report = f
        .create(&with(vec![
            variant(&f, "eu", &["size"], Some("{matchLabels: {region: eu}}")),
            variant(&f, "us", &["size"], None),
        ]))
        .unwrap();
    assert_eq!(report.mapping.sequence, Some(1));
    let names: Vec<&str> = report.mapping.variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["eu", "us"]);
    assert_eq!(f.git(&["tag", "-l"]), "rel-1");
    assert!(f.show("rel-1", "variants/eu/deployment.yaml").contains("eu.registry.example.com/redis-operator:v1.0.0"));
    let yaml = f.show("rel-1", "release.yaml");
    assert!(yaml.contains("selector:\n      matchLabels:\n        region: eu"), "{yaml}");

    // What an agent verifies is the signed release; its own facts pick the rendering.
    let verified = agent_verify(&f, "cluster-a", "rel-1").unwrap();
    let facts = ClusterFacts { server_version: "v1.36.0".into(), architectures: vec!["amd64".into()] };
    let region = |r: &str| std::collections::BTreeMap::from([("region".to_string(), r.to_string())]);
    let eu = verified.clone().for_cluster(&facts, &region("eu")).unwrap();
    assert_eq!(eu.variant(), Some("eu"));
    assert_eq!(eu.release().spec.image.repository, "eu.registry.example.com/redis-operator");
    assert!(eu.files().keys().all(|p| p.starts_with("variants/eu/")), "{:?}", eu.files().keys());
    let us = verified.for_cluster(&facts, &region("ap")).unwrap();
    assert_eq!((us.variant(), us.release().spec.sequence), (Some("us"), Some(1)));

    // Cut again with the same variants: already released; with other variants: the id is taken.
    let again = f.create(&with(vec![
        variant(&f, "eu", &["size"], Some("{matchLabels: {region: eu}}")),
        variant(&f, "us", &["size"], None),
    ]));
    assert_eq!(again.unwrap().outcome, CreateOutcome::AlreadyReleased);
    match f.create(&with(vec![variant(&f, "eu", &["size"], Some("{matchLabels: {region: eu}}"))])) {
        Err(RelengError::Refused(Refusal::IdReused { differences, .. })) => {
            assert!(differences.contains("variants/ manifests differ"), "{differences}")
        }
        other => panic!("expected the id to be refused, got {other:?}"),
    }
}

#[test]
fn a_variant_pins_its_image_per_architecture_inside_a_multi_arch_index() {
    let f = Fixture::new();
    let base = f.manifests("render", "v1.0.0", "v1alpha2", &["size"], &[]);
    let digest = |c: &str| format!("sha256:{}", c.repeat(64));
    let index = format!("{IMAGE_REPO}:v1.0.0@{}", digest("0"));
    let dir = f.manifests("render-multi", "v1.0.0", "v1alpha2", &["size"], &[]);
    std::fs::write(dir.join("deployment.yaml"), deployment_yaml(&index)).unwrap();
    let variants = fleetgate::releng::create::parse_variants(
        &[format!("multi={}", dir.display())],
        &[],
        &[format!("multi={index}")],
        &[format!("multi=amd64@{}", digest("a")), format!("multi=arm64@{}", digest("b"))],
    )
    .unwrap();
    let report = f.create(&CreateRequest { variants, ..f.request("rel-1", &base, "v1.0.0") }).unwrap();
    let recorded: Vec<&String> = report.mapping.variants[0].platforms["operator"].keys().collect();
    assert_eq!(recorded, ["amd64", "arm64"]);
    assert!(f.show("rel-1", "release.yaml").contains(&format!("arm64: {}", digest("b"))));

    // A cluster whose nodes all have their image in the index runs the variant; one with a node
    // of another architecture is told which architectures the images are built for.
    let verified = agent_verify(&f, "cluster-a", "rel-1").unwrap();
    let on = |archs: &[&str]| ClusterFacts {
        server_version: "v1.36.0".into(),
        architectures: archs.iter().map(|a| a.to_string()).collect(),
    };
    let mixed = verified.clone().for_cluster(&on(&["amd64", "arm64"]), &Default::default()).unwrap();
    assert_eq!(mixed.variant(), Some("multi"));
    match verified.for_cluster(&on(&["amd64", "s390x"]), &Default::default()) {
        Err(e @ VerifyError::NoVariant { .. }) => {
            let said = fleetgate::model::error_chain(&e);
            assert!(said.contains("[amd64, s390x]") && said.contains("multi: images for amd64|arm64"), "{said}");
        }
        other => panic!("expected no variant to fit, got {other:?}"),
    }
}

/// A binding of a role the release does not define cannot be judged without a cluster: the
/// release is signed, and the output says the agents judge it against the cluster's role.
#[test]
fn a_binding_of_a_role_outside_the_release_is_left_to_the_agents_and_said_so() {
    let f = Fixture::new();
    let m = f.manifests("render", "v1.0.0", "v1alpha2", &["size"], &[]);
    std::fs::write(
        m.join("view.yaml"),
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: viewers, namespace: redis-system}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}\n\
         subjects: [{kind: ServiceAccount, name: redis-operator, namespace: redis-system}]\n",
    )
    .unwrap();
    let args = create_args(&f, "rel-1", m.to_str().unwrap(), "v1.0.0");
    let out = f.fleetgate(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(
            "bindings of ClusterRole view, which the release does not define, are judged by the agents against the \
             cluster's roles"
        ),
        "{text}"
    );
}
