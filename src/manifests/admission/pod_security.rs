//! Pod Security Standards (`baseline`, `restricted`) over every pod template of a release: Pods,
//! and the templates of Deployments, StatefulSets, DaemonSets, ReplicaSets, ReplicationControllers,
//! Jobs and CronJobs.
//!
//! The checks follow the published standard
//! (<https://kubernetes.io/docs/concepts/security/pod-security-standards/>) as the API server's
//! PodSecurity admission implements it; a finding names the container (when the field is a
//! container's) and the field, so the owner can fix the template.

use crate::manifests::Manifest;
use crate::model::PodSecurityLevel;
use serde_json::Value;

/// Capabilities a baseline container may add: the container runtime's default set.
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Namespaced sysctls that cannot affect other pods on the node.
const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

const SELINUX_TYPES: [&str; 5] = ["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"];

/// Volume types a restricted pod may use.
const RESTRICTED_VOLUMES: [&str; 9] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
    "image",
];

const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";

/// One field of a pod template that breaks the level.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PodFinding {
    /// Where the pod spec is in the object (`spec.template.spec`, `spec` for a Pod).
    pub template: String,
    /// The container the field belongs to; None for a pod-level field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The field, relative to the pod spec or the container (`securityContext.privileged`).
    pub field: String,
    /// What it says, or what it lacks.
    pub value: String,
}

impl std::fmt::Display for PodFinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pod template {}: ", self.template)?;
        if let Some(c) = &self.container {
            write!(f, "container {c}: ")?;
        }
        write!(f, "{} {}", self.field, self.value)
    }
}

/// The pod template of `m`, if its kind has one: (path, pod metadata, pod spec).
fn template(m: &Manifest) -> Option<(&'static str, Option<&Value>, &Value)> {
    let data = &m.object.data;
    let at = |path: &[&str]| path.iter().try_fold(data, |v, k| v.get(k));
    let kind = (m.key.group.as_str(), m.key.kind.as_str());
    match kind {
        ("", "Pod") => Some(("spec", None, data.get("spec")?)),
        ("apps", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet")
        | ("batch", "Job")
        | ("", "ReplicationController") => {
            Some(("spec.template.spec", at(&["spec", "template", "metadata"]), at(&["spec", "template", "spec"])?))
        }
        ("batch", "CronJob") => Some((
            "spec.jobTemplate.spec.template.spec",
            at(&["spec", "jobTemplate", "spec", "template", "metadata"]),
            at(&["spec", "jobTemplate", "spec", "template", "spec"])?,
        )),
        _ => None,
    }
}

/// The first field of `m`'s pod template that `level` forbids.
pub(super) fn check(level: PodSecurityLevel, m: &Manifest) -> Option<PodFinding> {
    if level == PodSecurityLevel::Privileged {
        return None;
    }
    let (path, meta, spec) = template(m)?;
    // A Pod's own annotations are in the typed metadata, a template's in its `metadata`.
    let annotations: Vec<(String, String)> = match meta {
        Some(meta) => meta
            .get("annotations")
            .and_then(Value::as_object)
            .map(|a| a.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
            .unwrap_or_default(),
        None => m.object.metadata.annotations.clone().unwrap_or_default().into_iter().collect(),
    };
    let (field, value, container) = pod_finding(level, spec, &annotations)?;
    Some(PodFinding { template: path.into(), container, field, value })
}

type Found = (String, String, Option<String>);

fn is_true(v: Option<&Value>) -> bool {
    v.and_then(Value::as_bool) == Some(true)
}

fn str_at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

fn pod_finding(level: PodSecurityLevel, spec: &Value, annotations: &[(String, String)]) -> Option<Found> {
    let pod = |field: &str, value: String| Some((field.to_string(), value, None));
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        if is_true(spec.get(host)) {
            return pod(host, "is true".into());
        }
    }
    let volumes = spec.get("volumes").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    for v in volumes {
        let name = v.get("name").and_then(Value::as_str).unwrap_or("");
        if v.get("hostPath").is_some() {
            return pod(&format!("volumes[{name}].hostPath"), "is set (hostPath volumes are forbidden)".into());
        }
        if level == PodSecurityLevel::Restricted
            && let Some(kind) =
                v.as_object().and_then(|o| o.keys().find(|k| *k != "name" && !RESTRICTED_VOLUMES.contains(&k.as_str())))
        {
            return pod(&format!("volumes[{name}].{kind}"), format!("is a volume type {level} forbids"));
        }
    }
    let psc = spec.get("securityContext").cloned().unwrap_or(Value::Null);
    let sysctls = psc.get("sysctls").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if let Some(s) = sysctls.iter().filter_map(|s| s.get("name")?.as_str()).find(|s| !SAFE_SYSCTLS.contains(s)) {
        return pod("securityContext.sysctls", format!("sets {s}, which is not a safe sysctl"));
    }
    if let Some((field, value)) = context_finding(&psc) {
        return pod(&format!("securityContext.{field}"), value);
    }
    for (key, value) in annotations {
        if key.starts_with(APPARMOR_ANNOTATION) && value != "runtime/default" && !value.starts_with("localhost/") {
            return pod(&format!("metadata.annotations[{key}]"), format!("is {value:?}"));
        }
    }
    if level == PodSecurityLevel::Restricted && psc.get("runAsUser").and_then(Value::as_i64) == Some(0) {
        return pod("securityContext.runAsUser", "is 0 (root)".into());
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in spec.get(list).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
            let name = c.get("name").and_then(Value::as_str).unwrap_or("").to_string();
            if let Some((field, value)) = container_finding(level, c, &psc) {
                return Some((field, value, Some(name)));
            }
        }
    }
    None
}

/// Baseline rules that apply alike to the pod's and to each container's securityContext.
fn context_finding(sc: &Value) -> Option<(String, String)> {
    let found = |f: &str, v: String| Some((f.to_string(), v));
    if str_at(sc, &["seccompProfile", "type"]) == Some("Unconfined") {
        return found("seccompProfile.type", "is Unconfined".into());
    }
    if str_at(sc, &["appArmorProfile", "type"]) == Some("Unconfined") {
        return found("appArmorProfile.type", "is Unconfined".into());
    }
    if let Some(t) = str_at(sc, &["seLinuxOptions", "type"]).filter(|t| !SELINUX_TYPES.contains(t)) {
        return found("seLinuxOptions.type", format!("is {t:?}"));
    }
    for f in ["user", "role"] {
        if let Some(v) = str_at(sc, &["seLinuxOptions", f]).filter(|v| !v.is_empty()) {
            return found(&format!("seLinuxOptions.{f}"), format!("is {v:?} (must be unset)"));
        }
    }
    if is_true(sc.get("windowsOptions").and_then(|w| w.get("hostProcess"))) {
        return found("windowsOptions.hostProcess", "is true".into());
    }
    None
}

fn container_finding(level: PodSecurityLevel, c: &Value, psc: &Value) -> Option<(String, String)> {
    let sc = c.get("securityContext").cloned().unwrap_or(Value::Null);
    let found = |f: &str, v: String| Some((f.to_string(), v));
    if is_true(sc.get("privileged")) {
        return found("securityContext.privileged", "is true".into());
    }
    let caps =
        |k: &str| sc.get("capabilities").and_then(|c| c.get(k)).and_then(Value::as_array).cloned().unwrap_or_default();
    let added: Vec<String> = caps("add").iter().filter_map(Value::as_str).map(str::to_string).collect();
    if let Some(cap) = added.iter().find(|c| !BASELINE_CAPABILITIES.contains(&c.as_str())) {
        return found("securityContext.capabilities.add", format!("adds {cap}, beyond the baseline set"));
    }
    let ports = c.get("ports").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if let Some(p) = ports.iter().filter_map(|p| p.get("hostPort")?.as_i64()).find(|p| *p != 0) {
        return found("ports[].hostPort", format!("is {p} (host ports are forbidden)"));
    }
    if let Some(m) = str_at(&sc, &["procMount"]).filter(|m| *m != "Default") {
        return found("securityContext.procMount", format!("is {m}"));
    }
    if let Some((field, value)) = context_finding(&sc) {
        return found(&format!("securityContext.{field}"), value);
    }
    if level < PodSecurityLevel::Restricted {
        return None;
    }
    if sc.get("allowPrivilegeEscalation").and_then(Value::as_bool) != Some(false) {
        return found("securityContext.allowPrivilegeEscalation", "must be false".into());
    }
    let non_root = sc.get("runAsNonRoot").or_else(|| psc.get("runAsNonRoot")).and_then(Value::as_bool);
    if non_root != Some(true) {
        return found("securityContext.runAsNonRoot", "must be true (here or in the pod's securityContext)".into());
    }
    if sc.get("runAsUser").and_then(Value::as_i64) == Some(0) {
        return found("securityContext.runAsUser", "is 0 (root)".into());
    }
    let seccomp = str_at(&sc, &["seccompProfile", "type"]).or_else(|| str_at(psc, &["seccompProfile", "type"]));
    if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
        return found(
            "securityContext.seccompProfile.type",
            "must be RuntimeDefault or Localhost (here or in the pod's securityContext)".into(),
        );
    }
    if !caps("drop").iter().any(|c| c.as_str() == Some("ALL")) {
        return found("securityContext.capabilities.drop", "must contain ALL".into());
    }
    if let Some(cap) = added.iter().find(|c| *c != "NET_BIND_SERVICE") {
        return found(
            "securityContext.capabilities.add",
            format!("adds {cap}; restricted allows only NET_BIND_SERVICE"),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    const RESTRICTED_CONTAINER: &str = r#"{"name": "c", "image": "i", "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}, "capabilities": {"drop": ["ALL"]}}}"#;

    fn spec_with(container: Value, pod: Value) -> Value {
        let mut spec = pod;
        spec["containers"] = json!([container]);
        spec
    }

    fn restricted_container() -> Value {
        serde_json::from_str(RESTRICTED_CONTAINER).unwrap()
    }

    fn patched(patch: Value) -> Value {
        let mut c = restricted_container();
        for (k, v) in patch.as_object().unwrap() {
            if k == "securityContext" {
                for (sk, sv) in v.as_object().unwrap() {
                    c["securityContext"][sk] = sv.clone();
                }
            } else {
                c[k] = v.clone();
            }
        }
        c
    }

    #[rstest]
    #[case::compliant(json!({}), json!({}), None, None)]
    #[case::privileged(json!({"securityContext": {"privileged": true}}), json!({}), Some("securityContext.privileged"), Some("c"))]
    #[case::cap_add(json!({"securityContext": {"capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}}), json!({}), Some("securityContext.capabilities.add"), Some("c"))]
    #[case::host_port(json!({"ports": [{"containerPort": 80, "hostPort": 80}]}), json!({}), Some("ports[].hostPort"), Some("c"))]
    #[case::proc_mount(json!({"securityContext": {"procMount": "Unmasked"}}), json!({}), Some("securityContext.procMount"), Some("c"))]
    #[case::container_seccomp(json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}), json!({}), Some("securityContext.seccompProfile.type"), Some("c"))]
    #[case::host_network(json!({}), json!({"hostNetwork": true}), Some("hostNetwork"), None)]
    #[case::host_pid(json!({}), json!({"hostPID": true}), Some("hostPID"), None)]
    #[case::host_path(json!({}), json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}), Some("volumes[root].hostPath"), None)]
    #[case::sysctl(json!({}), json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}), Some("securityContext.sysctls"), None)]
    #[case::safe_sysctl(json!({}), json!({"securityContext": {"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]}}), None, None)]
    #[case::selinux(json!({}), json!({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}), Some("securityContext.seLinuxOptions.type"), None)]
    #[case::pod_apparmor(json!({}), json!({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}), Some("securityContext.appArmorProfile.type"), None)]
    fn baseline(
        #[case] container: Value,
        #[case] pod: Value,
        #[case] field: Option<&str>,
        #[case] in_container: Option<&str>,
    ) {
        let spec = spec_with(patched(container), pod);
        let found = pod_finding(PodSecurityLevel::Baseline, &spec, &[]);
        assert_eq!(found.as_ref().map(|f| f.0.as_str()), field, "{found:?}");
        assert_eq!(found.and_then(|f| f.2).as_deref(), in_container);
    }

    #[rstest]
    #[case::compliant(json!({}), json!({}), None)]
    #[case::escalation(json!({"securityContext": {"allowPrivilegeEscalation": true}}), json!({}), Some("securityContext.allowPrivilegeEscalation"))]
    #[case::root(json!({"securityContext": {"runAsNonRoot": false}}), json!({}), Some("securityContext.runAsNonRoot"))]
    #[case::no_drop(json!({"securityContext": {"capabilities": {"drop": ["NET_RAW"]}}}), json!({}), Some("securityContext.capabilities.drop"))]
    #[case::add_chown(json!({"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}}), json!({}), Some("securityContext.capabilities.add"))]
    #[case::seccomp_pod_level(json!({"securityContext": {"seccompProfile": null}}), json!({"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}), None)]
    #[case::no_seccomp(json!({"securityContext": {"seccompProfile": null}}), json!({}), Some("securityContext.seccompProfile.type"))]
    #[case::host_path_volume_type(json!({}), json!({"volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}]}), Some("volumes[n].nfs"))]
    #[case::allowed_volume(json!({}), json!({"volumes": [{"name": "cfg", "configMap": {"name": "c"}}]}), None)]
    fn restricted(#[case] container: Value, #[case] pod: Value, #[case] field: Option<&str>) {
        let spec = spec_with(patched(container), pod);
        let found = pod_finding(PodSecurityLevel::Restricted, &spec, &[]);
        assert_eq!(found.as_ref().map(|f| f.0.as_str()), field, "{found:?}");
    }

    #[test]
    fn a_plain_container_is_baseline_but_not_restricted() {
        let spec = json!({"containers": [{"name": "app", "image": "i"}]});
        assert_eq!(pod_finding(PodSecurityLevel::Baseline, &spec, &[]), None);
        let found = pod_finding(PodSecurityLevel::Restricted, &spec, &[]).unwrap();
        assert_eq!((found.0.as_str(), found.2.as_deref()), ("securityContext.allowPrivilegeEscalation", Some("app")));
    }

    #[test]
    fn apparmor_annotation() {
        let spec = json!({"containers": [{"name": "app", "image": "i"}]});
        let bad = [(format!("{APPARMOR_ANNOTATION}app"), "unconfined".to_string())];
        assert!(pod_finding(PodSecurityLevel::Baseline, &spec, &bad).is_some());
        let good = [(format!("{APPARMOR_ANNOTATION}app"), "runtime/default".to_string())];
        assert_eq!(pod_finding(PodSecurityLevel::Baseline, &spec, &good), None);
    }
}
