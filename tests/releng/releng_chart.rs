//! `release create --chart` with the real `helm` (built by `hack/helm-binary.sh`): the chart is
//! rendered with its CRDs into one file per template source, its name, version and values digest
//! land in release.yaml, the same chart and values give the same tree (folder or `.tgz`, re-run
//! or not), and each way it can go wrong says what to do.

use crate::releng_common;

use fleetgate_testenv::operator_fixture::helm_binary;
use releng_common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const CHART_YAML: &str = "apiVersion: v2\nname: redis-operator\nversion: 2.4.1\nappVersion: v1.0.0\n";
const VALUES_YAML: &str = "image:\n  repository: registry.example.com/redis-operator\n  tag: v1.0.0\nreplicas: 1\n";
const DEPLOYMENT: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}
  namespace: {{ .Release.Namespace }}
spec:
  replicas: {{ .Values.replicas }}
  selector: {matchLabels: {app: {{ .Release.Name }}}}
  template:
    metadata: {labels: {app: {{ .Release.Name }}}}
    spec:
      containers:
        - name: manager
          image: {{ .Values.image.repository }}:{{ .Values.image.tag }}
";
const CONFIGMAP: &str = "\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-settings
  namespace: {{ .Release.Namespace }}
data:
  kubeVersion: {{ .Capabilities.KubeVersion.Version | quote }}
";

/// A chart folder `name` whose CRD serves v1alpha2, with `extra` (path, text) files added.
fn chart(f: &Fixture, name: &str, extra: &[(&str, &str)]) -> PathBuf {
    let d = f.dir.path().join(name);
    std::fs::create_dir_all(d.join("templates")).unwrap();
    std::fs::create_dir_all(d.join("crds")).unwrap();
    std::fs::write(d.join("Chart.yaml"), CHART_YAML).unwrap();
    std::fs::write(d.join("values.yaml"), VALUES_YAML).unwrap();
    std::fs::write(d.join("templates/deployment.yaml"), DEPLOYMENT).unwrap();
    std::fs::write(d.join("templates/settings.yaml"), CONFIGMAP).unwrap();
    std::fs::write(d.join("crds/redisclusters.yaml"), crd_yaml("v1alpha2", &["size"], &[])).unwrap();
    for (path, text) in extra {
        std::fs::write(d.join(path), text).unwrap();
    }
    d
}

/// `fleetgate release create --chart` with `helm` (None: `FLEETGATE_HELM` set to nothing usable
/// and no helm on `PATH`).
fn create(f: &Fixture, helm: Option<&Path>, id: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetgate"));
    cmd.args(["release", "create", "--repo"]).arg(&f.repo).args(["--id", id]);
    cmd.args(["--crd-version", "v1alpha2", "--git-commit", "a1b2c3d4e5f6", "--all", "--sign-key", &f.fpr]);
    cmd.args(args).env("GNUPGHOME", f.gpg.path()).env("NO_COLOR", "1").env_remove("FLEETGATE_SIGN_KEY");
    match helm {
        Some(h) => cmd.env("FLEETGATE_HELM", h),
        None => cmd.env("FLEETGATE_HELM", f.dir.path().join("no-helm-here")),
    };
    cmd.current_dir(f.dir.path()).output().unwrap()
}

fn helm() -> PathBuf {
    helm_binary().unwrap_or_else(|e| panic!("{e:#}"))
}

#[test]
fn a_chart_is_rendered_into_one_file_per_source_and_recorded_in_release_yaml() {
    let f = Fixture::new();
    let helm = helm();
    let dir = chart(&f, "chart", &[]);
    let prod = f.dir.path().join("prod.yaml");
    std::fs::write(&prod, "replicas: 3\n").unwrap();
    let (chart, prod) = (dir.to_str().unwrap(), prod.to_str().unwrap());
    let args = [
        "--chart",
        chart,
        "--values",
        prod,
        "--set",
        "image.tag=v1.1.0",
        "--image",
        "registry.example.com/redis-operator:v1.1.0",
        "--requires-kubernetes",
        ">=1.30",
    ];
    let out = create(&f, Some(&helm), "rel-1", &args);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("redis-operator 2.4.1"), "{}", stdout(&out));

    let files = f.git(&["ls-tree", "-r", "--name-only", "rel-1", "operator/"]);
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        ["operator/crds/redisclusters.yaml", "operator/templates/deployment.yaml", "operator/templates/settings.yaml"]
    );
    let deployment = f.show("rel-1", "operator/templates/deployment.yaml");
    assert!(deployment.starts_with("# Source: redis-operator/templates/deployment.yaml\n"), "{deployment}");
    assert!(deployment.contains("namespace: redis-system") && deployment.contains("name: redis-operator\n"));
    assert!(deployment.contains("replicas: 3") && deployment.contains("redis-operator:v1.1.0"), "{deployment}");
    let settings = f.show("rel-1", "operator/templates/settings.yaml");
    assert!(settings.contains("kubeVersion: \"v1.30.0\""), "--kube-version is the range's lower bound: {settings}");

    let release: serde_json::Value = serde_saphyr::from_str(&f.show("rel-1", "release.yaml")).unwrap();
    let spec = &release["spec"];
    assert_eq!(spec["chartVersion"], "2.4.1");
    assert_eq!((&spec["chart"]["name"], &spec["chart"]["version"]), (&"redis-operator".into(), &"2.4.1".into()));
    let digest = spec["chart"]["valuesDigest"].as_str().unwrap();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{digest}");

    // Same chart and values again: nothing new. The packaged chart renders the same tree; other
    // values are other content under the same id.
    let again = create(&f, Some(&helm), "rel-1", &args);
    assert!(again.status.success() && stdout(&again).contains("Already released"), "{}", stderr(&again));
    let pkg = Command::new(&helm).args(["package", chart, "-d"]).arg(f.dir.path()).output().unwrap();
    assert!(pkg.status.success(), "{}", String::from_utf8_lossy(&pkg.stderr));
    let tgz = f.dir.path().join("redis-operator-2.4.1.tgz");
    let mut packaged = args;
    packaged[1] = tgz.to_str().unwrap();
    let from_tgz = create(&f, Some(&helm), "rel-1", &packaged);
    assert!(from_tgz.status.success() && stdout(&from_tgz).contains("Already released"), "{}", stderr(&from_tgz));
    let mut other = args;
    other[5] = "image.tag=v1.2.0";
    let reused = create(&f, Some(&helm), "rel-1", &other);
    assert_eq!(reused.status.code(), Some(1), "{}", stderr(&reused));
    assert!(stderr(&reused).contains("chart redis-operator 2.4.1 values sha256:"), "{}", stderr(&reused));
}

#[test]
fn chart_problems_say_what_to_do() {
    let f = Fixture::new();
    let helm = helm();
    let good = chart(&f, "good", &[]);
    let good = good.to_str().unwrap();
    let image = ["--image", "registry.example.com/redis-operator:v1.0.0"];

    let both = create(&f, Some(&helm), "rel-1", &[&["--chart", good, "--chart-version", "1.0.0"][..], &image].concat());
    assert_eq!(both.status.code(), Some(2), "--chart and --chart-version together: {}", stderr(&both));
    assert!(stderr(&both).contains("--chart-version"), "{}", stderr(&both));

    let missing = create(&f, None, "rel-1", &[&["--chart", good][..], &image].concat());
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing).contains("install helm") && stderr(&missing).contains("FLEETGATE_HELM"),
        "{}",
        stderr(&missing)
    );

    let broken = chart(&f, "broken", &[("templates/bad.yaml", "kind: {{ .Values.nope.deeper }}\n")]);
    let out = create(&f, Some(&helm), "rel-1", &["--chart", broken.to_str().unwrap(), image[0], image[1]]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("helm could not render") && stderr(&out).contains("nil pointer"),
        "helm's stderr is shown: {}",
        stderr(&out)
    );

    let unversioned = chart(&f, "unversioned", &[("Chart.yaml", "apiVersion: v2\nname: redis-operator\n")]);
    let out = create(&f, Some(&helm), "rel-1", &["--chart", unversioned.to_str().unwrap(), image[0], image[1]]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("bad Chart.yaml"), "{}", stderr(&out));

    assert_eq!(f.git(&["tag", "-l"]), "", "nothing was released");
}

#[test]
fn each_variant_is_rendered_with_its_values_over_the_base_and_signed_in_one_release() {
    let f = Fixture::new();
    let helm = helm();
    let dir = chart(&f, "chart", &[]);
    let values = |name: &str, text: &str| {
        let path = f.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let prod = values("prod.yaml", "replicas: 3\n");
    let eu = values("values-eu.yaml", "image:\n  repository: eu.registry.example.com/redis-operator\nreplicas: 2\n");
    let arm = values("values-arm.yaml", "image:\n  tag: v1.0.0-arm64\n");
    let (eu_arg, arm_arg) = (format!("eu={eu}"), format!("arm={arm}"));
    let args = [
        "--chart",
        dir.to_str().unwrap(),
        "--values",
        &prod,
        "--image",
        "registry.example.com/redis-operator:v1.0.0",
        "--variant",
        &eu_arg,
        "--variant-selector",
        "eu={matchLabels: {region: eu}}",
        "--variant-image",
        "eu=eu.registry.example.com/redis-operator:v1.0.0",
        "--variant",
        &arm_arg,
        "--variant-image",
        "arm=registry.example.com/redis-operator:v1.0.0-arm64",
    ];
    let out = create(&f, Some(&helm), "rel-1", &args);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains(
            "variant    eu: eu.registry.example.com/redis-operator:v1.0.0 under variants/eu/ (selects region=eu)"
        ),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains(
            "variant    arm: registry.example.com/redis-operator:v1.0.0-arm64 under variants/arm/ (the default)"
        ),
        "{}",
        stdout(&out)
    );

    // The base values, then the variant's file: eu keeps prod's tag and takes its registry and
    // replicas; arm keeps prod's 3 replicas and takes its tag.
    let eu_deployment = f.show("rel-1", "variants/eu/templates/deployment.yaml");
    assert!(
        eu_deployment.contains("replicas: 2")
            && eu_deployment.contains("image: eu.registry.example.com/redis-operator:v1.0.0"),
        "{eu_deployment}"
    );
    let arm_deployment = f.show("rel-1", "variants/arm/templates/deployment.yaml");
    assert!(
        arm_deployment.contains("replicas: 3")
            && arm_deployment.contains("image: registry.example.com/redis-operator:v1.0.0-arm64"),
        "{arm_deployment}"
    );
    assert_eq!(
        f.show("rel-1", "variants/eu/crds/redisclusters.yaml"),
        f.show("rel-1", "operator/crds/redisclusters.yaml")
    );

    let release: serde_json::Value = serde_saphyr::from_str(&f.show("rel-1", "release.yaml")).unwrap();
    let variants = release["spec"]["variants"].as_array().unwrap();
    let digests: Vec<&str> = variants.iter().map(|v| v["valuesDigest"].as_str().unwrap()).collect();
    let base = release["spec"]["chart"]["valuesDigest"].as_str().unwrap();
    assert!(digests.iter().all(|d| d.starts_with("sha256:") && *d != base) && digests[0] != digests[1], "{digests:?}");
    assert_eq!(variants[0]["selector"]["matchLabels"]["region"], "eu");
    assert!(variants[1].get("selector").is_none(), "the last variant without a selector is the default");

    // A variant whose values change a CRD is refused, naming the CRD and the variant.
    let crd_values = values("values-crd.yaml", "replicas: 2\n");
    let templated = chart(
        &f,
        "templated",
        &[(
            "templates/extra-crd.yaml",
            "{{- if eq (int .Values.replicas) 2 }}\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: backups.cache.example.com}\nspec:\n  group: cache.example.com\n  scope: Namespaced\n  names: {plural: backups, singular: backup, kind: Backup}\n  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]\n{{- end }}\n",
        )],
    );
    let crd_arg = format!("big={crd_values}");
    let refused = create(
        &f,
        Some(&helm),
        "rel-2",
        &[
            "--chart",
            templated.to_str().unwrap(),
            "--image",
            "registry.example.com/redis-operator:v1.0.0",
            "--variant",
            &crd_arg,
        ],
    );
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused)
            .contains("CRD backups.cache.example.com is in variant big but not in the base rendering (operator/)"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(f.git(&["tag", "-l"]), "rel-1");
}
