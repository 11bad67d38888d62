//! The Helm chart `deploy/chart` with the real `helm` (hack/helm-binary.sh), a real API server,
//! Debian's `promtool` and the agent: the chart lints and its schema refuses bad values; with the
//! default values it renders the objects of the kustomize base `deploy/` (names, namespaces, RBAC
//! rules, configuration, Deployment); every value becomes agent configuration the agent accepts,
//! on a path the Deployment mounts; with everything switched on, every object passes a
//! server-side dry run (the Prometheus Operator's kinds from minimal CRDs made here); the alerts
//! read metrics the agent exposes and fire, and only, when they should (`promtool test rules`);
//! the whole output of `fleetgate agent rbac` can be given as a value; an agent holding the
//! chart's RBAC with the chart's configuration runs a release to success; and docs/FIRST-CLUSTER.md,
//! which installs the agent with this chart, runs as written on a test cluster.

use crate::agent_support;
use crate::docs_support;

use agent_support::{CLUSTER, Fleet, within};
use docs_support::{Page, Shell};
use fleetgate::agent::config::{Label, Named};
use fleetgate::agent::{AgentSettings, Outcome};
use fleetgate::model::{PromotionMode, RELEASE_ADMISSION_POLICY_KIND, ReleaseAdmissionPolicy, parse_document};
use fleetgate_testenv::operator_fixture::helm_binary;
use fleetgate_testenv::{ClusterOptions, DeployManifests, TestCluster};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Every toggle and optional value on: what the dry run and the configuration check render.
const EVERYTHING: &[&str] = &[
    "--set=metrics.serviceMonitor.enabled=true",
    "--set=metrics.serviceMonitor.labels.release=prometheus",
    "--set=metrics.prometheusRule.enabled=true",
    "--set=networkPolicy.enabled=true",
    "--set=gitCredentials.type=token",
    "--set=gitCredentials.caCert=true",
    "--set=webhook.enabled=true",
    "--set=forge.kind=github,forge.url=https://api.github.com,forge.repository=platform/fleet",
    "--set=prometheus.default=http://prometheus-operated.monitoring.svc:9090",
    "--set=notify.secretName=fleetgate-notify",
    "--set=allowGateKinds[0]=Certificate.cert-manager.io",
    "--set=promotions=signed",
    "--set=extraConfig.driftInterval=5m",
    "--set=nodeSelector.kubernetes\\.io/os=linux",
    "--set=tolerations[0].key=dedicated,tolerations[0].operator=Exists,tolerations[0].effect=NoSchedule",
    "--set=trustedKeys.configMapName=release-signers",
    "--set=approverKeys.secretName=fleetgate-approver-keys",
    "--set=approvers[0]=ana",
    "--set=labels.region=eu",
    "--set=planPullRequests=true",
];

/// The three values the chart has no default for, as deploy/config.yaml sets them: with these the
/// chart's defaults render deploy/'s objects.
const REQUIRED: &[&str] =
    &["--set=repo=https://git.example.com/platform/fleet.git", "--set=cluster=canary", "--set=fleet=redis-fleet"];

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/chart")
}

fn helm(args: &[&str]) -> Output {
    let helm = helm_binary().unwrap_or_else(|e| panic!("{e:#}"));
    Command::new(helm).args(args).output().expect("running helm")
}

/// `helm template fleetgate deploy/chart` with [`REQUIRED`] and `args` (which win).
fn try_render(args: &[&str]) -> Output {
    let chart = chart_dir();
    let mut all = vec!["template", "fleetgate", chart.to_str().unwrap(), "--namespace", "fleetgate-system"];
    all.extend(REQUIRED);
    all.extend(args);
    helm(&all)
}

/// [`try_render`], which must succeed (else panics with helm's stderr).
fn render(args: &[&str]) -> String {
    let out = try_render(args);
    assert!(out.status.success(), "helm template {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Asserts helm refused `out` and said `says`.
fn assert_refused(what: &str, out: &Output, says: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what} was accepted");
    assert!(stderr.contains(says), "{what}: helm did not say {says:?}: {stderr}");
}

fn rendered(args: &[&str]) -> DeployManifests {
    DeployManifests::from_yaml("helm template deploy/chart", &render(args)).unwrap_or_else(|e| panic!("{e:#}"))
}

fn kind(obj: &DynamicObject) -> &str {
    obj.types.as_ref().map(|t| t.kind.as_str()).unwrap_or_default()
}

/// `Kind namespace/name`, how objects are matched between the chart and deploy/.
fn key(obj: &DynamicObject) -> String {
    format!(
        "{} {}/{}",
        kind(obj),
        obj.metadata.namespace.as_deref().unwrap_or(""),
        obj.metadata.name.as_deref().unwrap_or("")
    )
}

fn find<'a>(objects: &[&'a DynamicObject], kind_name: &str) -> &'a DynamicObject {
    objects.iter().copied().find(|o| key(o) == kind_name).unwrap_or_else(|| panic!("no {kind_name}"))
}

fn config_data(objects: &[&DynamicObject]) -> (AgentSettings, ReleaseAdmissionPolicy) {
    let data = &find(objects, "ConfigMap fleetgate-system/fleetgate-agent-config").data["data"];
    let settings: AgentSettings =
        serde_saphyr::from_str(data["agent.yaml"].as_str().unwrap()).expect("agent.yaml is agent configuration");
    let policy = parse_document(
        "admission-policy.yaml",
        data["admission-policy.yaml"].as_str().unwrap(),
        RELEASE_ADMISSION_POLICY_KIND,
    )
    .expect("the admission baseline parses");
    (settings, policy)
}

#[test]
fn the_chart_lints_and_its_schema_refuses_bad_values() {
    let chart = chart_dir();
    let mut lint = vec!["lint", "--strict", chart.to_str().unwrap()];
    lint.extend(REQUIRED);
    let out = helm(&lint);
    assert!(
        out.status.success(),
        "helm lint: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for (set, says) in [
        ("cluster=Not_A_Label", "/cluster"),
        ("gitCredentials.type=password", "/gitCredentials/type"),
        ("forge.kind=bitbucket", "/forge/kind"),
        ("metrics.serviceMonitor.enabled=true,service.enabled=false", "needs service.enabled"),
        ("forge.kind=github", "forge.url"),
        ("notify.format.oncall=webhook", "set notify.secretName"),
        ("notify.format.oncall=email", "/notify/format/oncall"),
        ("labels.region=eu west", "/labels/region"),
        // Unknown keys, at the top and deeper down: a misspelt value is refused, not ignored.
        ("clusterName=cluster-a", "clusterName"),
        ("image.registry=registry.example.com", "registry"),
        ("networkPolicy.egresPorts[0]=443", "egresPorts"),
        ("admissionPolicy.allowedNamespace[0]=redis-system", "allowedNamespace"),
    ] {
        assert_refused(&format!("--set {set}"), &try_render(&["--set", set]), says);
    }
    // A pasted rule without verbs.
    let out = try_render(&["--set-json", r#"rbac.operator.clusterRules=[{"apiGroups":[""],"resources":["pods"]}]"#]);
    assert_refused("a rule without verbs", &out, "verbs");
}

/// Without `repo` or `cluster` the chart installs nothing: the schema requires them, and the
/// template fails too where schema validation is skipped; each refusal names the missing value.
#[test]
fn the_chart_refuses_to_install_without_repo_and_cluster() {
    let chart = chart_dir();
    let template = |args: &[&str]| {
        let mut all = vec!["template", "fleetgate", chart.to_str().unwrap()];
        all.extend(args);
        helm(&all)
    };
    assert_refused("no values", &template(&[]), "repo");
    assert_refused("no values", &template(&[]), "cluster");
    assert_refused("no cluster", &template(&[REQUIRED[0]]), "cluster");
    assert_refused("no repo", &template(&[REQUIRED[1]]), "repo");
    assert_refused("an empty repo", &template(&["--set=repo=", REQUIRED[1]]), "/repo");
    let unchecked = ["--skip-schema-validation", REQUIRED[1]];
    assert_refused("no repo, schema skipped", &template(&unchecked), "repo is required");
    let unchecked = ["--skip-schema-validation", REQUIRED[0]];
    assert_refused("no cluster, schema skipped", &template(&unchecked), "cluster is required");
}

/// `--set-file rbac.operator.manifest=FILE` in place of the rule lists.
fn from_manifest(file: &Path) -> Vec<String> {
    vec![
        format!("--set-file=rbac.operator.manifest={}", file.display()),
        "--set=rbac.operator.clusterRules=null".into(),
        "--set=rbac.operator.namespaceRules=null".into(),
    ]
}

/// The (Cluster)Roles, their rules in any order, and their bindings, as JSON.
fn rbac_objects(m: &DeployManifests) -> Vec<String> {
    let mut out: Vec<String> = m
        .all_objects()
        .iter()
        .filter(|o| o.types.as_ref().is_some_and(|t| t.api_version.starts_with("rbac.")))
        .map(|o| {
            let mut o = (*o).clone();
            if let Some(Value::Array(rules)) = o.data.get_mut("rules") {
                rules.sort_by_key(|r| r.to_string());
            }
            serde_json::to_string(&o).unwrap()
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_operators_rbac_can_be_given_as_the_whole_output_of_agent_rbac() {
    // deploy/rbac-operator.yaml is `fleetgate agent rbac` output for the template's release
    // (src/apply/rbac.rs checks that).
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/rbac-operator.yaml");
    let args = from_manifest(&shipped);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(rbac_objects(&rendered(&args)), rbac_objects(&rendered(&[])));

    for (file, says) in [("deploy/rbac-state.yaml", "no ClusterRole"), ("Cargo.toml", "is not YAML")] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let out = try_render(&[&format!("--set-file=rbac.operator.manifest={}", path.display())]);
        assert_refused(file, &out, says);
    }
}

/// The chart's labels are deploy/'s plus Helm's; the Pod template carries a checksum annotation;
/// the Service states its default type. Everything else must be equal.
fn normalized(obj: &DynamicObject) -> Value {
    let mut data = obj.data.clone();
    if kind(obj) == "Deployment" {
        let meta = &mut data["spec"]["template"]["metadata"];
        meta.as_object_mut().unwrap().remove("annotations");
        meta["labels"].as_object_mut().unwrap().retain(|k, _| deploy_label(k));
    }
    if kind(obj) == "Service" && data["spec"]["type"] == "ClusterIP" {
        data["spec"].as_object_mut().unwrap().remove("type");
    }
    if kind(obj) == "ConfigMap" {
        data.as_object_mut().unwrap().remove("data");
    }
    data
}

fn deploy_label(key: &str) -> bool {
    ["app.kubernetes.io/name", "app.kubernetes.io/part-of"].contains(&key) || key.starts_with("pod-security.")
}

#[test]
fn default_values_render_the_objects_of_deploy() {
    let chart = rendered(&[]);
    let chart: Vec<&DynamicObject> = chart.all_objects();
    let shipped = DeployManifests::shipped().unwrap();
    let shipped: Vec<&DynamicObject> = shipped.all_objects();

    let mut chart_keys: Vec<String> = chart.iter().map(|o| key(o)).collect();
    let mut shipped_keys: Vec<String> = shipped.iter().map(|o| key(o)).collect();
    chart_keys.sort();
    shipped_keys.sort();
    assert_eq!(chart_keys, shipped_keys, "the chart and deploy/ install different objects");

    for ours in &shipped {
        let theirs = find(&chart, &key(ours));
        assert_eq!(ours.types, theirs.types, "{}", key(ours));
        let labels = theirs.metadata.labels.clone().unwrap_or_default();
        for (k, v) in ours.metadata.labels.iter().flatten() {
            assert_eq!(labels.get(k), Some(v), "{}: label {k}", key(ours));
        }
        let extra: Vec<&String> =
            labels.keys().filter(|k| !ours.metadata.labels.iter().flatten().any(|(o, _)| o == *k)).collect();
        assert!(extra.iter().all(|k| k.starts_with("app.kubernetes.io/") || k.starts_with("helm.sh/")), "{extra:?}");
        assert_eq!(normalized(theirs), normalized(ours), "{}", key(ours));
    }
    // The configuration is compared as what the agent reads, not as text (comments, key order).
    assert_eq!(config_data(&chart), config_data(&shipped));
    // Pods of a kustomize install and of the chart match the same selector, so the chart can take
    // the Deployment over (a selector cannot change).
    let selector = |objs: &[&DynamicObject]| {
        find(objs, "Deployment fleetgate-system/fleetgate-agent").data["spec"]["selector"].clone()
    };
    assert_eq!(selector(&chart), json!({"matchLabels": {"app.kubernetes.io/name": "fleetgate-agent"}}));
}

/// The volume of `pod`'s agent container that `path` lies on.
fn mounted_volume(pod: &Value, path: &Path) -> Value {
    let mounts: BTreeMap<&str, &str> = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["mountPath"].as_str().unwrap(), m["name"].as_str().unwrap()))
        .collect();
    let (_, name) = mounts
        .iter()
        .find(|(m, _)| path.starts_with(m))
        .unwrap_or_else(|| panic!("{path:?} is not mounted ({mounts:?})"));
    pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == *name).cloned().unwrap()
}

#[test]
fn every_value_becomes_agent_configuration_on_a_mounted_path() {
    let manifests = rendered(EVERYTHING);
    let objects = manifests.all_objects();
    let (settings, _) = config_data(&objects);
    assert_eq!(settings.git_token_file.as_deref(), Some(Path::new("/etc/fleetgate/git/token")));
    assert_eq!(settings.git_ca_file.as_deref(), Some(Path::new("/etc/fleetgate/git/ca.crt")));
    assert_eq!(settings.webhook_secret_file.as_deref(), Some(Path::new("/etc/fleetgate/webhook/secret")));
    assert_eq!(settings.allow_gate_kinds, ["Certificate.cert-manager.io"]);
    assert_eq!(settings.drift_interval, Some(std::time::Duration::from_secs(300)));
    assert_eq!(settings.heartbeat_interval, Some(std::time::Duration::from_secs(120)));
    assert_eq!(settings.promotions, Some(PromotionMode::Signed));
    assert_eq!(settings.approvers, ["ana"]);
    assert_eq!(settings.labels, ["region=eu".parse::<Label>().unwrap()]);
    assert_eq!(settings.plan_pull_requests, Some(true));
    let forge_token = settings.forge.token_file.clone().expect("forge.tokenFile");

    let deployment = find(&objects, "Deployment fleetgate-system/fleetgate-agent");
    let pod = &deployment.data["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let volume = |path: &Path| mounted_volume(pod, path);
    let mut paths = vec![settings.state_dir.clone().unwrap(), settings.admission_policy.clone().unwrap()];
    paths.extend(settings.trusted_keys.clone());
    paths.extend(settings.approver_keys.clone());
    paths.extend([
        settings.git_token_file.clone().unwrap(),
        settings.git_ca_file.clone().unwrap(),
        settings.webhook_secret_file.clone().unwrap(),
    ]);
    for p in &paths {
        volume(p);
    }
    assert_eq!(volume(&forge_token)["secret"]["secretName"], "fleetgate-forge-token");
    assert_eq!(volume(&settings.trusted_keys[0])["configMap"]["name"], "release-signers");
    assert_eq!(volume(&settings.approver_keys[0])["secret"]["secretName"], "fleetgate-approver-keys");
    let notify = container["env"].as_array().unwrap().iter().find(|e| e["name"] == "FLEETGATE_NOTIFY_URL");
    assert_eq!(notify.unwrap()["valueFrom"]["secretKeyRef"], json!({"name": "fleetgate-notify", "key": "urls"}));
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    // A configuration change rolls the Pods (the agent reads agent.yaml once, at start).
    let checksum = |m: &DeployManifests| {
        find(&m.all_objects(), "Deployment fleetgate-system/fleetgate-agent").data["spec"]["template"]["metadata"]
            ["annotations"]["checksum/config"]
            .clone()
    };
    assert_ne!(checksum(&manifests), checksum(&rendered(&[])));
}

#[test]
fn notification_values_become_endpoint_settings_with_their_hmac_secrets_mounted() {
    let manifests = rendered(&[
        "--set=notify.secretName=fleetgate-notify",
        "--set=notify.on.oncall=failed\\,rolledBack",
        "--set=notify.format.oncall=webhook,notify.format.chat=teams",
        "--set=notify.timeout=10s",
    ]);
    let objects = manifests.all_objects();
    let (settings, _) = config_data(&objects);
    assert_eq!(settings.notify_on, Named::list(&["oncall=failed,rolledBack"]));
    assert_eq!(settings.notify_format, Named::list(&["chat=teams", "oncall=webhook"]));
    // Only the webhook endpoint signs; its secret is a key of the same Secret as the URLs.
    let hmac = Path::new("/etc/fleetgate/notify/hmac-oncall");
    assert_eq!(settings.notify_secret_file, Named::list(&[format!("oncall={}", hmac.display())]));
    assert_eq!(settings.notify_timeout, Some(std::time::Duration::from_secs(10)));
    let pod = &find(&objects, "Deployment fleetgate-system/fleetgate-agent").data["spec"]["template"]["spec"];
    assert_eq!(mounted_volume(pod, hmac)["secret"]["secretName"], "fleetgate-notify");
}

#[test]
fn a_github_app_replaces_the_forge_token() {
    let manifests = rendered(&[
        "--set=forge.kind=github,forge.url=https://api.github.com,forge.repository=platform/fleet",
        "--set=forge.app.id=4242,forge.app.installationId=99",
    ]);
    let (settings, _) = config_data(&manifests.all_objects());
    let forge = settings.forge;
    assert_eq!((forge.app_id, forge.app_installation_id), (Some(4242), Some(99)));
    assert_eq!(forge.app_key_file.as_deref(), Some(Path::new("/etc/fleetgate/forge/private-key.pem")));
    assert_eq!(forge.token_file, None);
    assert!(forge.resolve().unwrap().is_some(), "the agent takes this configuration");
}

/// Minimal CRDs for the Prometheus Operator's kinds the chart renders: the dry run needs their
/// group, version, kind and scope served, not their schema.
fn monitoring_crd(kind: &str, plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.monitoring.coreos.com")},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn everything_switched_on_passes_a_server_side_dry_run() {
    let cluster = TestCluster::start(ClusterOptions::new("helm-chart")).await.unwrap_or_else(|e| panic!("{e:#}"));
    let admin = cluster.client();
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for (kind, plural) in [("ServiceMonitor", "servicemonitors"), ("PrometheusRule", "prometheusrules")] {
        crds.create(&PostParams::default(), &monitoring_crd(kind, plural)).await.unwrap();
        let name = format!("{plural}.monitoring.coreos.com");
        within(&name, 30, await_condition(crds.clone(), &name, conditions::is_crd_established())).await.unwrap();
    }
    let discovery = Discovery::new(admin.clone()).run().await.unwrap();

    let manifests = rendered(EVERYTHING);
    let objects = manifests.all_objects();
    for k in ["ServiceMonitor", "PrometheusRule", "NetworkPolicy", "Service", "Deployment"] {
        assert!(objects.iter().any(|o| kind(o) == k), "no {k} rendered");
    }
    let api = |obj: &DynamicObject| {
        let gvk = GroupVersionKind::try_from(obj.types.as_ref().unwrap()).unwrap();
        let (resource, caps) = discovery.resolve_gvk(&gvk).unwrap_or_else(|| panic!("{gvk:?} is not served"));
        match caps.scope {
            Scope::Namespaced => Api::<DynamicObject>::namespaced_with(
                admin.clone(),
                obj.metadata.namespace.as_deref().expect("a namespace"),
                &resource,
            ),
            Scope::Cluster => Api::all_with(admin.clone(), &resource),
        }
    };
    // Namespaces for real (a dry run of an object in a missing namespace is refused), then
    // everything else as a dry run of the server-side apply `helm` or `kubectl` would send.
    let (namespaces, rest): (Vec<_>, Vec<_>) = objects.iter().partition(|o| kind(o) == "Namespace");
    assert_eq!(namespaces.len(), 2);
    for ns in namespaces {
        api(ns).create(&PostParams::default(), ns).await.unwrap_or_else(|e| panic!("{}: {e}", key(ns)));
    }
    let params = PatchParams::apply("helm-chart-test").dry_run();
    let mut failures = Vec::new();
    for obj in &rest {
        match api(obj).patch(obj.metadata.name.as_deref().unwrap(), &params, &Patch::Apply(obj)).await {
            Ok(answer) => assert_eq!(answer.metadata.name, obj.metadata.name),
            Err(e) => failures.push(format!("{}: {e}", key(obj))),
        }
    }
    assert!(failures.is_empty(), "server-side dry run refused:\n{}", failures.join("\n"));
    // A dry run stores nothing.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(admin, "fleetgate-system");
    assert!(deployments.get_opt("fleetgate-agent").await.unwrap().is_none());
}

/// `promtool test rules` input: per alert, series over an hour at one sample a minute and when
/// the alert must (and must not) fire. Cluster a misbehaves, cluster b is healthy; each has a
/// leader and a standby replica where that matters.
const ALERT_TESTS: &str = r#"
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  # a: first rollback at 20 min (the series appears, already at 1); b: rolled back long ago
  # (1 since the start), again at 45 min.
  - interval: 1m
    input_series:
      - series: 'fleetgate_rollbacks_total{cluster="a",reason="GateFailed"}'
        values: '_x20 1x40'
      - series: 'fleetgate_rollbacks_total{cluster="b",reason="GateFailed"}'
        values: '1x44 2x20'
    alert_rule_test:
      - {eval_time: 18m, alertname: FleetgateRollback, exp_alerts: []}
      - eval_time: 22m
        alertname: FleetgateRollback
        exp_alerts:
          - exp_labels: {cluster: a, reason: GateFailed, severity: warning}
            exp_annotations:
              summary: Cluster a rolled back a release (GateFailed)
              description: "The fleetgate agent of cluster a rolled back automatically (reason GateFailed). Its state ConfigMap's Events and the status notes (fleetgate status) name the gate and figure."
      - {eval_time: 40m, alertname: FleetgateRollback, exp_alerts: []}
      - eval_time: 47m
        alertname: FleetgateRollback
        exp_alerts:
          - exp_labels: {cluster: b, reason: GateFailed, severity: warning}
            exp_annotations:
              summary: Cluster b rolled back a release (GateFailed)
              description: "The fleetgate agent of cluster b rolled back automatically (reason GateFailed). Its state ConfigMap's Events and the status notes (fleetgate status) name the gate and figure."
  # a's leader syncs every minute until 20 min, then never again; b's always. Standbys never
  # sync (their gauge stays 0) and must not make a healthy cluster alert.
  - interval: 1m
    input_series:
      - series: 'fleetgate_last_sync_timestamp_seconds{cluster="a",pod="a-1"}'
        values: '0+60x20 1200x40'
      - series: 'fleetgate_last_sync_timestamp_seconds{cluster="a",pod="a-2"}'
        values: '0x60'
      - series: 'fleetgate_last_sync_timestamp_seconds{cluster="b",pod="b-1"}'
        values: '0+60x60'
      - series: 'fleetgate_last_sync_timestamp_seconds{cluster="b",pod="b-2"}'
        values: '0x60'
    alert_rule_test:
      # 15 min without a sync at 35 min, pending from 36, firing 5 min later.
      - {eval_time: 34m, alertname: FleetgateLastSyncTooOld, exp_alerts: []}
      - {eval_time: 39m, alertname: FleetgateLastSyncTooOld, exp_alerts: []}
      - eval_time: 45m
        alertname: FleetgateLastSyncTooOld
        exp_alerts:
          - exp_labels: {cluster: a, severity: warning}
            exp_annotations:
              summary: Cluster a has not completed a sync for 25m 0s
              description: "No reconcile pass of the fleetgate agent of cluster a completed recently: its passes fail (see the agent's logs and Warning Events) or it is stuck."
  # a's leader loses the Lease at 21 min and its standby never takes over; b keeps a leader.
  - interval: 1m
    input_series:
      - series: 'fleetgate_leader{cluster="a",pod="a-1"}'
        values: '1x20 0x40'
      - series: 'fleetgate_leader{cluster="a",pod="a-2"}'
        values: '0x60'
      - series: 'fleetgate_leader{cluster="b",pod="b-1"}'
        values: '1x60'
      - series: 'fleetgate_leader{cluster="b",pod="b-2"}'
        values: '0x60'
    alert_rule_test:
      - {eval_time: 24m, alertname: FleetgateNotLeader, exp_alerts: []}
      - eval_time: 30m
        alertname: FleetgateNotLeader
        exp_alerts:
          - exp_labels: {cluster: a, severity: critical}
            exp_annotations:
              summary: No fleetgate agent leads cluster a
              description: "Every agent of cluster a is a standby: none holds the Lease fleetgate-agent-a, so no release is applied or rolled back there."
  # a's endpoint oncall starts failing at 30 min (its failed series appears then, at 0, and
  # grows); b delivers everything.
  - interval: 1m
    input_series:
      - series: 'fleetgate_notifications_total{cluster="a",endpoint="oncall",outcome="delivered"}'
        values: '0+1x60'
      - series: 'fleetgate_notifications_total{cluster="a",endpoint="oncall",outcome="failed"}'
        values: '_x30 0+1x30'
      - series: 'fleetgate_notifications_total{cluster="b",endpoint="oncall",outcome="delivered"}'
        values: '0+1x60'
    alert_rule_test:
      - {eval_time: 29m, alertname: FleetgateNotificationsFailing, exp_alerts: []}
      - eval_time: 35m
        alertname: FleetgateNotificationsFailing
        exp_alerts:
          - exp_labels: {cluster: a, endpoint: oncall, severity: warning}
            exp_annotations:
              summary: Cluster a's notifications to oncall are not arriving
              description: "The fleetgate agent of cluster a gave up on notifications to endpoint oncall in the last 15 minutes (see its log: notification not delivered). Statuses in Git are unaffected."
"#;

#[test]
fn the_alerts_fire_when_they_should_and_only_then() {
    let manifests =
        rendered(&["--set=metrics.prometheusRule.enabled=true", "--show-only=templates/prometheusrule.yaml"]);
    let objects = manifests.all_objects();
    assert_eq!(objects.len(), 1);
    let dir = tempfile::tempdir().unwrap();
    // The PrometheusRule's spec is a Prometheus rule file.
    std::fs::write(dir.path().join("rules.yaml"), serde_saphyr::to_string(&objects[0].data["spec"]).unwrap()).unwrap();
    std::fs::write(dir.path().join("alerts_test.yaml"), ALERT_TESTS).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("promtool (Debian's prometheus package)");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(run(&["check", "rules", "rules.yaml"]).contains("SUCCESS: 4 rules found"));
    run(&["test", "rules", "alerts_test.yaml"]);
}

/// The alerts query series the agent exposes: a renamed metric would leave them silent forever.
#[test]
fn the_alerts_use_metric_names_the_agent_exposes() {
    let manifests =
        rendered(&["--set=metrics.prometheusRule.enabled=true", "--show-only=templates/prometheusrule.yaml"]);
    let rules = &manifests.all_objects()[0].data["spec"]["groups"][0]["rules"];
    let metrics = fleetgate::agent::metrics::Metrics::new("c");
    // Every series the rules read, with a sample (a rollback family has none before the first).
    metrics.record_rollback("GateFailed");
    metrics.mark_synced();
    metrics.notifications().record("oncall", fleetgate::agent::metrics::NotificationOutcome::Failed);
    let exposed = metrics.encode();
    let mut used = Vec::new();
    for rule in rules.as_array().unwrap() {
        let expr = rule["expr"].as_str().unwrap();
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("fleetgate_") && !used.contains(&word) {
                used.push(word);
                let sample = format!("\n{word}{{cluster=\"c\"");
                assert!(
                    exposed.contains(&sample),
                    "{} reads {word}, which the agent does not expose:\n{exposed}",
                    rule["alert"]
                );
            }
        }
    }
    assert_eq!(
        used,
        [
            "fleetgate_rollbacks_total",
            "fleetgate_last_sync_timestamp_seconds",
            "fleetgate_leader",
            "fleetgate_notifications_total"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_the_charts_rbac_and_configuration_runs_a_release() {
    let manifests = rendered(&[&format!("--set=cluster={CLUSTER}")]);
    let fleet = Fleet::start_deployed("helm-agent", true, &manifests).await;
    let (chart_settings, _) = config_data(&manifests.all_objects());
    // The chart's configuration, with what only the test knows (the repo's URL, the ServiceAccount's
    // kubeconfig, local paths) over it; the admission baseline is the chart's, written out.
    let data = &find(&manifests.all_objects(), "ConfigMap fleetgate-system/fleetgate-agent-config").data["data"];
    let policy = fleet.dir.path().join("admission-policy.yaml");
    std::fs::write(&policy, data["admission-policy.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(chart_settings.cluster.as_deref(), Some(CLUSTER));
    let webhook_secret = fleet.dir.path().join("webhook-secret");
    std::fs::write(&webhook_secret, "a-webhook-secret").unwrap();
    assert!(chart_settings.webhook_secret_file.is_some(), "the chart mounts a webhook secret by default");
    let settings = chart_settings
        .overlay(AgentSettings {
            admission_policy: Some(policy),
            webhook_secret_file: Some(webhook_secret),
            ..fleet.settings()
        })
        .unwrap();

    fleet.release("rel-1", |_| {});
    // The rules the cluster got from the chart's defaults are the ones `fleetgate agent rbac`
    // prints for this release, and its whole output given as `rbac.operator.manifest` renders them.
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["agent", "rbac", "--release", "rel-1", "--repo"])
        .arg(&fleet.work)
        .arg("--trusted-keys")
        .arg(&fleet.trusted)
        .output()
        .unwrap();
    assert!(out.status.success(), "agent rbac: {}", String::from_utf8_lossy(&out.stderr));
    let printed = fleet.dir.path().join("rbac.yaml");
    std::fs::write(&printed, &out.stdout).unwrap();
    let args = from_manifest(&printed);
    let from_output = rendered(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(rbac_objects(&from_output), rbac_objects(&manifests));

    fleet.promote("rel-1");
    let mut agent = fleet.agent_with(settings).await;
    assert_eq!(within("rel-1", 180, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    assert_eq!(fleet.operator_image().await, Some(agent_support::image_of("rel-1")));
}

/// The settings block of docs/FIRST-CLUSTER.md names these, and the test gives them its own values.
const FIRST_CLUSTER_SETTINGS: [&str; 5] = ["SRC", "FLEET_URL", "CLUSTER", "AGENT_IMAGE", "TAG"];

/// docs/FIRST-CLUSTER.md, followed on a test cluster with workloads (kwok runs the Operator's
/// Pods), the fleet repo on a git daemon, the real helm, kubectl, gpg and openssl: every `sh` block
/// in order, as its marker says (the page's last section explains them). At the end the cluster
/// reports `success` for the release, verified with the status key the page registered, and the
/// installed Deployment runs the image the page built and pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_cluster_page_runs_on_a_test_cluster() {
    const PAGE: &str = "docs/FIRST-CLUSTER.md";
    let page = Page::read(PAGE);
    let cluster = TestCluster::start(ClusterOptions::new("first-cluster").with_workloads(true))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let daemon = fleetgate_testenv::GitDaemon::start().expect("git daemon");
    let url = daemon.create_bare("fleet.git").expect("bare repo");
    let values =
        [env!("CARGO_MANIFEST_DIR"), url.as_str(), "cluster-a", "registry.test/platform/fleetgate", "0.1.0-test"];
    let mut shell = Shell::new();
    shell.set_env("KUBECONFIG", cluster.kubeconfig_path().to_str().unwrap());
    shell.path_prepend(helm_binary().unwrap_or_else(|e| panic!("{e:#}")).parent().unwrap());
    // What the reader has and the page assumes: the tools, a Git identity and the Git token's file
    // (git:// takes no token; the Secret and its mount are still made and checked).
    shell.ok("for tool in kubectl helm gpg openssl git; do command -v $tool >/dev/null || \
              { echo \"$tool is not on PATH; docs/FIRST-CLUSTER.md uses it\"; exit 1; }; done");
    shell.ok("git config --global user.name 'Rita Release' && git config --global user.email rita@example.com\n\
              echo unused-over-git > git-token");

    let mut printed = String::new();
    let mut agent = None;
    let blocks = page.fenced("sh");
    assert!(blocks.len() >= 8, "{PAGE}: only {} sh blocks", blocks.len());
    for block in blocks {
        let marker = block
            .marker
            .as_deref()
            .unwrap_or_else(|| panic!("{PAGE}: this block has no <!-- test: … --> line before it:\n{}", block.text()));
        let (how, arg) = marker.split_once(' ').unwrap_or((marker, ""));
        let script = format!("set -eo pipefail\n{}", block.text());
        match how {
            "settings" => {
                let names: Vec<&str> =
                    block.lines.iter().filter_map(|l| l.split_once('=').map(|(n, _)| n.trim())).collect();
                assert_eq!(names, FIRST_CLUSTER_SETTINGS, "{PAGE}: the settings the test substitutes");
                let ours: Vec<String> =
                    FIRST_CLUSTER_SETTINGS.iter().zip(values).map(|(n, v)| format!("{n}='{v}'")).collect();
                shell.ok(&ours.join("\n"));
            }
            "run" => printed.push_str(&shell.ok(&script)),
            "skip" => {}
            "agent" => agent = Some(start_as_deployed(&cluster, &shell.work().join("pod")).await),
            "until" => {
                let (process, log) = agent.as_mut().expect("the agent runs before an `until` block");
                let output = within(&format!("{PAGE}: `{}` saying {arg:?}", block.text()), 300, async {
                    loop {
                        let ran = shell.run(&script);
                        if ran.code == 0 && ran.output.contains(arg) {
                            return ran.output;
                        }
                        if let Some(status) = process.exited() {
                            panic!("the agent exited ({status}):\n{}", std::fs::read_to_string(&*log).unwrap());
                        }
                        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                    }
                })
                .await;
                printed.push_str(&output);
            }
            other => panic!("{PAGE}: unknown test marker {other:?}"),
        }
    }
    let (mut process, log) = agent.expect("the page starts the agent");
    assert!(process.exited().is_none(), "the agent exited:\n{}", std::fs::read_to_string(&log).unwrap());

    // What `helm install` printed afterwards (NOTES.txt) names the next commands with this
    // install's values: reading the status key and registering it (without which later waves never
    // open), and how to watch.
    let notes = &printed[printed.find("NOTES:").expect("helm install printed its notes")..];
    for line in [
        "fleetgate agent --print-status-key --cluster cluster-a --state-namespace fleetgate-system \
         --repo {url} --trusted-keys release-signer.asc > status-key.pub",
        "fleetgate cluster register cluster-a --status-key \"$(cat status-key.pub)\" --repo FLEET-CLONE",
        "git -C FLEET-CLONE push origin main",
        "kubectl -n fleetgate-system describe configmap fleetgate-state-cluster-a",
        "fleetgate status --repo {url}",
    ] {
        let line = line.replace("{url}", &url);
        assert!(notes.lines().any(|l| l.trim() == line), "NOTES lack `{line}`:\n{notes}");
    }
    // The chart runs the image the page pushed.
    let deployment: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(cluster.client(), "fleetgate-system");
    let deployment = deployment.get("fleetgate-agent").await.unwrap();
    let image = deployment.spec.unwrap().template.spec.unwrap().containers[0].image.clone();
    assert_eq!(image.as_deref(), Some("registry.test/platform/fleetgate:0.1.0-test"));
    // The release runs: the Operator's Deployment has the release's image.
    let operator: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(cluster.client(), "redis-system");
    let operator = operator.get("redis-operator").await.unwrap();
    let image = operator.spec.unwrap().template.spec.unwrap().containers[0].image.clone();
    assert_eq!(image.as_deref(), Some("registry.example.com/redis-operator:v1.2.3-build.456"));
}

/// Starts `fleetgate agent` as the Pod of the installed Deployment `fleetgate-system/fleetgate-agent`
/// would run it, in `root`: its container's arguments and environment (field references resolved
/// as the kubelet does), every ConfigMap and Secret volume written as files under `root` at its
/// mount path and every emptyDir made there, and every mount path in the arguments, the environment
/// and the ConfigMaps' files moved under `root`. Two things differ from the Pod and are given as
/// flags: the API credential is the ServiceAccount's token in a kubeconfig (a Pod gets the same
/// token mounted), and it listens on a free loopback port (a Pod has its own 8080). Returns the
/// process once it answers `/readyz`, and its log file.
async fn start_as_deployed(cluster: &TestCluster, root: &Path) -> (fleetgate_testenv::process::Guarded, PathBuf) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    const NS: &str = "fleetgate-system";
    let admin = cluster.client();
    let deployment = Api::<Deployment>::namespaced(admin.clone(), NS).get("fleetgate-agent").await.unwrap();
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let container = &pod.containers[0];
    let mounts = container.volume_mounts.clone().unwrap_or_default();

    let mut paths: Vec<String> = mounts.iter().map(|m| regex::escape(&m.mount_path)).collect();
    paths.sort_by_key(|p| std::cmp::Reverse(p.len()));
    let mounted = regex::Regex::new(&format!(r#"(?m)(^|[\s="'\[,])({})(/|$|[\s"',\]])"#, paths.join("|"))).unwrap();
    let local = |text: &str| mounted.replace_all(text, format!("${{1}}{}${{2}}${{3}}", root.display())).into_owned();

    for mount in &mounts {
        let dir = root.join(mount.mount_path.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        let volume = pod.volumes.iter().flatten().find(|v| v.name == mount.name).expect("a volume for each mount");
        if let Some(source) = &volume.config_map {
            let map = Api::<ConfigMap>::namespaced(admin.clone(), NS).get(&source.name).await.unwrap();
            for (key, value) in map.data.unwrap_or_default() {
                std::fs::write(dir.join(key), local(&value)).unwrap();
            }
        } else if let Some(source) = &volume.secret {
            let name = source.secret_name.clone().unwrap();
            match Api::<Secret>::namespaced(admin.clone(), NS).get_opt(&name).await.unwrap() {
                Some(secret) => {
                    for (key, value) in secret.data.unwrap_or_default() {
                        std::fs::write(dir.join(key), value.0).unwrap();
                    }
                }
                None => assert_eq!(source.optional, Some(true), "the Pod would not start: no Secret {name}"),
            }
        } else {
            assert!(volume.empty_dir.is_some(), "volume {}: a kind this test does not mount", volume.name);
        }
    }

    let identity = cluster.agent_identity().await.unwrap_or_else(|e| panic!("{e:#}"));
    let port = fleetgate_testenv::process::free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetgate"));
    assert!(container.command.is_none(), "the image's entrypoint is fleetgate");
    cmd.args(container.args.iter().flatten().map(|a| local(a)));
    cmd.arg("--kubeconfig").arg(identity.kubeconfig_path());
    cmd.args(["--listen", &format!("127.0.0.1:{port}")]);
    cmd.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    for var in container.env.iter().flatten() {
        let value = match (&var.value, var.value_from.as_ref().and_then(|f| f.field_ref.as_ref())) {
            (Some(v), _) => local(v),
            (None, Some(field)) if field.field_path == "metadata.name" => "fleetgate-agent-7d9f8-x2k4q".into(),
            (None, Some(field)) if field.field_path == "metadata.namespace" => NS.into(),
            _ => panic!("env {}: a source this test does not resolve", var.name),
        };
        cmd.env(&var.name, value);
    }
    let log = root.join("agent.log");
    let mut process = fleetgate_testenv::process::Guarded::spawn("fleetgate agent", cmd, &log).unwrap();
    let ready = format!("127.0.0.1:{port}");
    fleetgate_testenv::wait::eventually("the agent answers /readyz", 120, || {
        if let Some(status) = process.exited() {
            panic!("the agent exited ({status}):\n{}", std::fs::read_to_string(&log).unwrap());
        }
        let answer = http_get(&ready, "/readyz");
        async move { answer.filter(|a| a.starts_with("HTTP/1.1 200")).map(|_| ()) }
    })
    .await;
    (process, log)
}

/// The status line and body of `GET path` from `addr`, if it answered.
fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}
