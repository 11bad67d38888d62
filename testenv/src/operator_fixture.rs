//! A generated operator at real scale, as a Helm chart, for tests that claim "works with a real
//! operator": ten CRDs of 0.3–1 MB whose schemas embed the API server's own PodSpec and Container
//! schemas (read from `/openapi/v3/api/v1` of a test cluster and inlined, since a CRD schema cannot
//! hold `$ref`), markdown in their descriptions, two groups and two API versions (older kinds
//! served at `v1` and `v1alpha1` with `v1` storage, newer kinds only at `v1alpha1`); a manager
//! Deployment (manager + metrics-proxy sidecar) and a webhook Deployment, three images in all;
//! RBAC, Services; `Chart.yaml`, `values.yaml` with the image tags, `templates/`.
//!
//! [`CrdGeneration::Upgraded`] is the next release's CRDs: a new optional field in every kind and a
//! new served version (`v1beta1`) for the newer kinds — changes a compatibility check must accept.
//!
//! [`helm_binary`] finds the `helm` that renders it (`hack/helm-binary.sh`, like the Kubernetes
//! binaries).

use anyhow::{Context as _, bail};
use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The `helm` binary: `FLEETGATE_HELM` if set, else what `hack/helm-binary.sh` prints (it builds
/// helm from its Go module once, then answers from the cache). Computed once per process.
pub fn helm_binary() -> anyhow::Result<PathBuf> {
    static HELM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    HELM.get_or_init(|| find_helm().map_err(|e| format!("{e:#}"))).clone().map_err(anyhow::Error::msg)
}

fn find_helm() -> anyhow::Result<PathBuf> {
    if let Some(h) = std::env::var_os("FLEETGATE_HELM").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(h));
    }
    crate::cluster::run_hack_script(
        "helm-binary.sh",
        &[],
        "set FLEETGATE_REPO to the fleetgate checkout, or FLEETGATE_HELM to a helm binary",
    )
}

/// The schemas of `/openapi/v3/api/v1` (`components.schemas`), read through `client`.
pub async fn core_v1_schemas(client: &kube::Client) -> anyhow::Result<Map<String, Value>> {
    let req = http::Request::get("/openapi/v3/api/v1").body(Vec::new())?;
    let doc: Value = client.request(req).await.context("GET /openapi/v3/api/v1")?;
    match doc.pointer("/components/schemas") {
        Some(Value::Object(m)) => Ok(m.clone()),
        _ => bail!("/openapi/v3/api/v1 has no components.schemas"),
    }
}

/// OpenAPI extensions a CRD schema does not accept (they drive strategic merge patch and the
/// discovery document, not validation).
const NOT_IN_CRDS: [&str; 6] = [
    "x-kubernetes-patch-merge-key",
    "x-kubernetes-patch-strategy",
    "x-kubernetes-unions",
    "x-kubernetes-group-version-kind",
    "discriminator",
    "fields-to-discriminateBy",
];

/// Schema `name` of `schemas` with every `$ref` replaced by the schema it names, in the form a
/// structural CRD schema needs: `allOf: [{$ref}]` wrappers merged into their field, int-or-string
/// and quantity (`oneOf` string/number) as `x-kubernetes-int-or-string`, object- and list-valued
/// `default`s dropped (a CRD default must validate on its own, and `{}` for a Container does not),
/// as are defaults outside their field's `enum`,
/// and [`NOT_IN_CRDS`] left out. A reference cycle (none in core/v1 today) is cut with
/// `x-kubernetes-preserve-unknown-fields`.
pub fn inline_schema(schemas: &Map<String, Value>, name: &str) -> anyhow::Result<Value> {
    let root = schemas.get(name).with_context(|| format!("no schema {name}"))?;
    inline(schemas, root, &mut vec![name.to_string()])
}

fn inline(schemas: &Map<String, Value>, node: &Value, stack: &mut Vec<String>) -> anyhow::Result<Value> {
    let Value::Object(obj) = node else { return Ok(node.clone()) };
    if let Some(Value::String(r)) = obj.get("$ref") {
        let name = r.rsplit('/').next().unwrap_or(r).to_string();
        if stack.contains(&name) {
            return Ok(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
        }
        let target = schemas.get(&name).with_context(|| format!("$ref to unknown schema {name}"))?;
        stack.push(name);
        let out = inline(schemas, target, stack);
        stack.pop();
        return out;
    }
    if obj.get("format").and_then(Value::as_str) == Some("int-or-string") || obj.contains_key("oneOf") {
        let mut out = Map::new();
        if let Some(d) = obj.get("description") {
            out.insert("description".into(), d.clone());
        }
        out.insert("x-kubernetes-int-or-string".into(), Value::Bool(true));
        return Ok(Value::Object(out));
    }
    let mut out = Map::new();
    if let Some(Value::Array(all)) = obj.get("allOf")
        && let [only] = all.as_slice()
        && let Value::Object(base) = inline(schemas, only, stack)?
    {
        out.extend(base);
    }
    for (k, v) in obj {
        match k.as_str() {
            "allOf" | "$ref" => {}
            k if NOT_IN_CRDS.contains(&k) => {}
            "default" if v.is_object() || v.is_array() => {}
            "properties" => {
                let mut props = Map::new();
                for (p, s) in v.as_object().into_iter().flatten() {
                    props.insert(p.clone(), inline(schemas, s, stack)?);
                }
                out.insert(k.to_string(), Value::Object(props));
            }
            "items" | "additionalProperties" if v.is_object() => {
                out.insert(k.to_string(), inline(schemas, v, stack)?);
            }
            _ => {
                out.insert(k.to_string(), v.clone());
            }
        }
    }
    // The built-in schemas carry Go zero values as defaults ("" for an enum of names); a CRD
    // default must be one of the enum's values.
    if let (Some(d), Some(Value::Array(allowed))) = (out.get("default"), out.get("enum"))
        && !allowed.contains(d)
    {
        out.remove("default");
    }
    Ok(Value::Object(out))
}

/// The schemas the CRDs embed, inlined once.
#[derive(Debug, Clone)]
pub struct CoreSchemas {
    pub pod_spec: Value,
    pub container: Value,
}

impl CoreSchemas {
    /// Reads and inlines PodSpec and Container from the cluster behind `client`.
    pub async fn fetch(client: &kube::Client) -> anyhow::Result<CoreSchemas> {
        let schemas = core_v1_schemas(client).await?;
        Ok(CoreSchemas {
            pod_spec: inline_schema(&schemas, "io.k8s.api.core.v1.PodSpec")?,
            container: inline_schema(&schemas, "io.k8s.api.core.v1.Container")?,
        })
    }
}

/// Which release's CRDs to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrdGeneration {
    Initial,
    /// + optional `spec.paused` in every kind, + served `v1beta1` for the newer kinds.
    Upgraded,
}

/// One custom resource kind of the fixture.
#[derive(Debug, Clone, Copy)]
pub struct FixtureKind {
    pub group: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    /// Served at `v1` (storage) and `v1alpha1`; otherwise a newer kind, only at `v1alpha1`.
    pub stable: bool,
}

pub const WORKLOADS_GROUP: &str = "workloads.fixture.example.com";
pub const DATA_GROUP: &str = "data.fixture.example.com";

pub const KINDS: [FixtureKind; 10] = [
    FixtureKind { group: WORKLOADS_GROUP, kind: "Pipeline", plural: "pipelines", stable: true },
    FixtureKind { group: WORKLOADS_GROUP, kind: "Worker", plural: "workers", stable: true },
    FixtureKind { group: WORKLOADS_GROUP, kind: "Scheduler", plural: "schedulers", stable: true },
    FixtureKind { group: DATA_GROUP, kind: "Store", plural: "stores", stable: true },
    FixtureKind { group: DATA_GROUP, kind: "Replica", plural: "replicas", stable: true },
    FixtureKind { group: DATA_GROUP, kind: "Backup", plural: "backups", stable: true },
    FixtureKind { group: WORKLOADS_GROUP, kind: "Canary", plural: "canaries", stable: false },
    FixtureKind { group: WORKLOADS_GROUP, kind: "Sandbox", plural: "sandboxes", stable: false },
    FixtureKind { group: DATA_GROUP, kind: "Snapshot", plural: "snapshots", stable: false },
    FixtureKind { group: DATA_GROUP, kind: "Restore", plural: "restores", stable: false },
];

impl FixtureKind {
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// `(name, storage)` of each served version, in the CRD's order.
    pub fn versions(&self, generation: CrdGeneration) -> Vec<(&'static str, bool)> {
        match (self.stable, generation) {
            (true, _) => vec![("v1", true), ("v1alpha1", false)],
            (false, CrdGeneration::Initial) => vec![("v1alpha1", true)],
            (false, CrdGeneration::Upgraded) => vec![("v1beta1", false), ("v1alpha1", true)],
        }
    }

    /// The CRD as JSON.
    pub fn crd(&self, core: &CoreSchemas, generation: CrdGeneration) -> Value {
        let versions: Vec<Value> = self
            .versions(generation)
            .into_iter()
            .map(|(name, storage)| {
                json!({
                    "name": name,
                    "served": true,
                    "storage": storage,
                    "schema": {"openAPIV3Schema": self.schema(core, name, generation)},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                })
            })
            .collect();
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {
                "name": self.crd_name(),
                "annotations": {"fixture.example.com/generated-by": "fleetgate-testenv operator_fixture"},
            },
            "spec": {
                "group": self.group,
                "scope": "Namespaced",
                "names": {
                    "plural": self.plural,
                    "singular": self.kind.to_lowercase(),
                    "kind": self.kind,
                    "listKind": format!("{}List", self.kind),
                    "categories": ["fixture"],
                },
                "versions": versions,
            },
        })
    }

    fn schema(&self, core: &CoreSchemas, version: &str, generation: CrdGeneration) -> Value {
        let kind = self.kind;
        let mut spec = Map::new();
        spec.insert(
            "replicas".into(),
            json!({"type": "integer", "format": "int32", "minimum": 0,
                   "description": format!("How many *{kind}* workers run.\n\n- `0` pauses the work & keeps the data\n- more than one shares the work")}),
        );
        spec.insert(
            "mode".into(),
            json!({"type": "string", "enum": ["Active", "Standby"],
                   "description": "*Active* serves traffic; *Standby* only replicates.\n\n* Active\n* Standby"}),
        );
        let container_list = |what: &str| {
            json!({"type": "array", "description": format!("{what} containers, *merged by name* & run beside the main one."),
                   "items": core.container, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
        };
        if self.stable && version == "v1" {
            spec.insert(
                "template".into(),
                json!({"type": "object", "description": format!("The pod template of each *{kind}* worker & its labels."),
                       "properties": {
                           "metadata": {"type": "object", "properties": {
                               "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                               "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}},
                           "spec": core.pod_spec}}),
            );
        } else if self.stable {
            // The older alpha version kept its template loose, as early operator versions do.
            spec.insert(
                "template".into(),
                json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                       "description": "The pod template (*unvalidated* in v1alpha1 & kept as given)."}),
            );
            spec.insert("sidecars".into(), container_list("Extra"));
        } else {
            spec.insert("workload".into(), core.container.clone());
            spec.insert("initWorkloads".into(), container_list("Init"));
            spec.insert("sidecars".into(), container_list("Sidecar"));
            spec.insert("debugContainers".into(), container_list("Debug"));
        }
        if generation == CrdGeneration::Upgraded {
            spec.insert(
                "paused".into(),
                json!({"type": "boolean", "description": "Stops reconciling this object.\n\n- *true*: hands off\n- *false* & unset: reconcile"}),
            );
        }
        let required = if self.stable && version == "v1" { json!(["template"]) } else { json!([]) };
        let mut spec_schema = json!({"type": "object", "properties": spec,
            "description": format!("Desired state of the *{kind}*.\n\nSee the operator's docs for:\n\n1. sizing\n2. upgrades & rollbacks")});
        if required.as_array().is_some_and(|r| !r.is_empty()) {
            spec_schema["required"] = required;
        }
        json!({
            "type": "object",
            "description": format!("A *{kind}* of the fixture operator (group `{}`, version `{version}`).", self.group),
            "properties": {
                "apiVersion": {"type": "string", "description": "Versioned schema of this object."},
                "kind": {"type": "string", "description": "The REST resource this object represents."},
                "metadata": {"type": "object"},
                "spec": spec_schema,
                "status": {"type": "object", "description": "Observed state, written by the *manager* only.", "properties": {
                    "observedGeneration": {"type": "integer", "format": "int64"},
                    "conditions": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                        "items": {"type": "object", "required": ["type", "status"], "properties": {
                            "type": {"type": "string"},
                            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                            "reason": {"type": "string"},
                            "message": {"type": "string"},
                            "lastTransitionTime": {"type": "string", "format": "date-time"}}}}}},
            },
        })
    }
}

/// The three images of the fixture, at one tag set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixtureImages {
    pub manager_tag: String,
    pub proxy_tag: String,
    pub webhook_tag: String,
}

pub const MANAGER_IMAGE: &str = "registry.example.com/fixture/manager";
pub const PROXY_IMAGE: &str = "registry.example.com/fixture/metrics-proxy";
pub const WEBHOOK_IMAGE: &str = "registry.example.com/fixture/webhook";

impl FixtureImages {
    /// `--image` and `--extra-image` arguments of `fleetgate release create` for these images.
    pub fn release_args(&self) -> Vec<String> {
        vec![
            "--image".into(),
            format!("{MANAGER_IMAGE}:{}", self.manager_tag),
            "--extra-image".into(),
            format!("metrics-proxy={PROXY_IMAGE}:{}", self.proxy_tag),
            "--extra-image".into(),
            format!("webhook={WEBHOOK_IMAGE}:{}", self.webhook_tag),
        ]
    }
}

/// One version of the fixture chart.
#[derive(Debug, Clone)]
pub struct FixtureChart {
    pub version: String,
    pub generation: CrdGeneration,
    /// Default image tags (values.yaml).
    pub images: FixtureImages,
}

/// Chart name (Chart.yaml `name`).
pub const CHART_NAME: &str = "fixture-operator";

impl FixtureChart {
    /// Writes the chart into `dir` (created; existing files of the same names replaced).
    pub fn write(&self, dir: &Path, core: &CoreSchemas) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir.join("crds"))?;
        std::fs::create_dir_all(dir.join("templates"))?;
        let write = |rel: &str, text: &str| {
            std::fs::write(dir.join(rel), text).with_context(|| format!("writing {}", dir.join(rel).display()))
        };
        write(
            "Chart.yaml",
            &format!(
                "apiVersion: v2\nname: {CHART_NAME}\ndescription: A generated operator at real scale for fleetgate's tests\n\
                 type: application\nversion: {}\nappVersion: \"{}\"\n",
                self.version, self.images.manager_tag
            ),
        )?;
        let i = &self.images;
        write(
            "values.yaml",
            &format!(
                "# Image tags are what a release changes; the repositories stay.\nmanager:\n  image:\n    repository: {MANAGER_IMAGE}\n    tag: {}\n  replicas: 1\n\
                 metricsProxy:\n  image:\n    repository: {PROXY_IMAGE}\n    tag: {}\n\
                 webhook:\n  image:\n    repository: {WEBHOOK_IMAGE}\n    tag: {}\n  replicas: 1\n\
                 # Extra labels on the manager's pods (quoted in the template, so --set works for strings).\npodLabels: {{}}\n",
                i.manager_tag, i.proxy_tag, i.webhook_tag
            ),
        )?;
        for kind in KINDS {
            let yaml = serde_saphyr::to_string(&kind.crd(core, self.generation))?;
            write(&format!("crds/{}.yaml", kind.crd_name()), &yaml)?;
        }
        for (name, text) in TEMPLATES {
            write(&format!("templates/{name}"), text)?;
        }
        Ok(())
    }
}

/// The chart's templates: plain Helm, the way operator charts are written.
const TEMPLATES: [(&str, &str); 6] = [
    (
        "_helpers.tpl",
        r#"{{- define "fixture.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
"#,
    ),
    (
        "namespace.yaml",
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {{ .Release.Namespace }}
  # deploy/ creates the namespace before the first release: the release adopts it.
  annotations:
    fleetgate.io/adopt: "true"
  labels:
    {{- include "fixture.labels" . | nindent 4 }}
"#,
    ),
    (
        "rbac.yaml",
        r#"apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .Release.Name }}-manager
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "fixture.labels" . | nindent 4 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ .Release.Name }}-manager
  labels:
    {{- include "fixture.labels" . | nindent 4 }}
rules:
  - apiGroups: ["workloads.fixture.example.com", "data.fixture.example.com"]
    resources: ["*"]
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
  - apiGroups: ["workloads.fixture.example.com", "data.fixture.example.com"]
    resources: ["*/status"]
    verbs: ["get", "update", "patch"]
  - apiGroups: ["apps"]
    resources: ["deployments", "statefulsets"]
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
  - apiGroups: [""]
    resources: ["pods", "services", "configmaps", "events"]
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .Release.Name }}-manager
  labels:
    {{- include "fixture.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ .Release.Name }}-manager
subjects:
  - kind: ServiceAccount
    name: {{ .Release.Name }}-manager
    namespace: {{ .Release.Namespace }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .Release.Name }}-leader-election
  namespace: {{ .Release.Namespace }}
rules:
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
  # Secrets only in its own namespace: a ClusterRole granting secrets is refused by admission.
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ .Release.Name }}-leader-election
  namespace: {{ .Release.Namespace }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ .Release.Name }}-leader-election
subjects:
  - kind: ServiceAccount
    name: {{ .Release.Name }}-manager
    namespace: {{ .Release.Namespace }}
"#,
    ),
    (
        "manager.yaml",
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-manager
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "fixture.labels" . | nindent 4 }}
    app.kubernetes.io/component: manager
spec:
  replicas: {{ .Values.manager.replicas }}
  selector:
    matchLabels:
      app.kubernetes.io/instance: {{ .Release.Name }}
      app.kubernetes.io/component: manager
  template:
    metadata:
      labels:
        app.kubernetes.io/instance: {{ .Release.Name }}
        app.kubernetes.io/component: manager
        {{- range $k, $v := .Values.podLabels }}
        {{ $k }}: {{ $v | toString | quote }}
        {{- end }}
    spec:
      serviceAccountName: {{ .Release.Name }}-manager
      containers:
        - name: manager
          image: "{{ .Values.manager.image.repository }}:{{ .Values.manager.image.tag }}"
          args: ["--leader-elect", "--metrics-bind-address=127.0.0.1:8080"]
          ports:
            - {name: health, containerPort: 8081}
          resources:
            requests: {cpu: 10m, memory: 64Mi}
        - name: metrics-proxy
          image: "{{ .Values.metricsProxy.image.repository }}:{{ .Values.metricsProxy.image.tag }}"
          args: ["--upstream=http://127.0.0.1:8080/", "--secure-listen-address=0.0.0.0:8443"]
          ports:
            - {name: metrics, containerPort: 8443}
"#,
    ),
    (
        "webhook.yaml",
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-webhook
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "fixture.labels" . | nindent 4 }}
    app.kubernetes.io/component: webhook
spec:
  replicas: {{ .Values.webhook.replicas }}
  selector:
    matchLabels:
      app.kubernetes.io/instance: {{ .Release.Name }}
      app.kubernetes.io/component: webhook
  template:
    metadata:
      labels:
        app.kubernetes.io/instance: {{ .Release.Name }}
        app.kubernetes.io/component: webhook
    spec:
      serviceAccountName: {{ .Release.Name }}-manager
      containers:
        - name: webhook
          image: "{{ .Values.webhook.image.repository }}:{{ .Values.webhook.image.tag }}"
          ports:
            - {name: https, containerPort: 9443}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ .Release.Name }}-webhook
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "fixture.labels" . | nindent 4 }}
spec:
  selector:
    app.kubernetes.io/instance: {{ .Release.Name }}
    app.kubernetes.io/component: webhook
  ports:
    - {name: https, port: 443, targetPort: https}
"#,
    ),
    (
        "service.yaml",
        r#"apiVersion: v1
kind: Service
metadata:
  name: {{ .Release.Name }}-metrics
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "fixture.labels" . | nindent 4 }}
spec:
  selector:
    app.kubernetes.io/instance: {{ .Release.Name }}
    app.kubernetes.io/component: manager
  ports:
    - {name: metrics, port: 8443, targetPort: metrics}
"#,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn schemas() -> Map<String, Value> {
        json!({
            "Outer": {"type": "object", "properties": {
                "inner": {"description": "the inner one", "allOf": [{"$ref": "#/components/schemas/Inner"}],
                          "x-kubernetes-patch-strategy": "merge", "default": {}},
                "port": {"$ref": "#/components/schemas/IntOrString"},
                "list": {"type": "array", "items": {"$ref": "#/components/schemas/Inner"}},
                "self": {"$ref": "#/components/schemas/Outer"}}},
            "Inner": {"type": "object", "description": "Inner", "properties": {"x": {"type": "string", "default": "TCP"},
                      "op": {"type": "string", "enum": ["In", "NotIn"], "default": ""}}},
            "IntOrString": {"format": "int-or-string", "oneOf": [{"type": "integer"}, {"type": "string"}]},
        })
        .as_object()
        .unwrap()
        .clone()
    }

    #[test]
    fn refs_are_inlined_in_crd_form() {
        let got = inline_schema(&schemas(), "Outer").unwrap();
        let inner = json!({"type": "object", "description": "the inner one", "properties": {
            "x": {"type": "string", "default": "TCP"}, "op": {"type": "string", "enum": ["In", "NotIn"]}}});
        assert_eq!(got["properties"]["inner"], inner, "allOf merged, own description wins, object default dropped");
        assert_eq!(got["properties"]["port"], json!({"x-kubernetes-int-or-string": true}));
        assert_eq!(got["properties"]["list"]["items"]["description"], "Inner");
        assert_eq!(got["properties"]["self"], json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
        assert!(!serde_json::to_string(&got).unwrap().contains("$ref"));
    }
}
