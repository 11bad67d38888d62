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
