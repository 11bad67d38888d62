{{/* The agent's namespace: namespace.name, or the release's when empty. */}}
{{- define "fleetgate.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/* Labels of every object: deploy/'s two, plus Helm's bookkeeping. */}}
{{- define "fleetgate.labels" -}}
app.kubernetes.io/name: fleetgate-agent
app.kubernetes.io/part-of: fleetgate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Pod selector. The same as deploy/'s, so a Deployment installed with kustomize can be taken
over by the chart (a Deployment's selector cannot change). */}}
{{- define "fleetgate.selectorLabels" -}}
app.kubernetes.io/name: fleetgate-agent
{{- end -}}

{{/* The ServiceAccount the agent's RBAC is bound to. */}}
{{- define "fleetgate.subject" -}}
- kind: ServiceAccount
  name: fleetgate-agent
  namespace: {{ include "fleetgate.namespace" . }}
{{- end -}}


{{/* The Operator's rules as {cluster: [rules], namespaces: {NAMESPACE: [rules]}}: from
rbac.operator.manifest (the whole output of `fleetgate agent rbac`, e.g. --set-file) when set,
else from clusterRules and namespaceRules. */}}
{{- define "fleetgate.operatorRules" -}}
{{- $cluster := .Values.rbac.operator.clusterRules -}}
{{- $namespaces := .Values.rbac.operator.namespaceRules -}}
{{- with .Values.rbac.operator.manifest -}}
{{- $cluster = list -}}
{{- $namespaces = dict -}}
{{- range $i, $text := splitList "\n---" (printf "\n%s" .) -}}
{{- $doc := fromYaml $text -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "rbac.operator.manifest: document %d is not YAML: %s" $i $doc.Error) -}}
{{- end -}}
{{- if eq ($doc.kind | default "") "ClusterRole" -}}
{{- $cluster = concat $cluster $doc.rules -}}
{{- else if eq ($doc.kind | default "") "Role" -}}
{{- $_ := set $namespaces $doc.metadata.namespace (concat (get $namespaces $doc.metadata.namespace | default list) $doc.rules) -}}
{{- end -}}
{{- end -}}
{{- if not $cluster -}}
{{- fail "rbac.operator.manifest: no ClusterRole with rules in it (paste the output of fleetgate agent rbac)" -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "cluster" $cluster "namespaces" $namespaces) -}}
{{- end -}}
