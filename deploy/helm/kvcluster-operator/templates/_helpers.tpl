{{/*
Labels of every object the chart templates: the name the operator's own code and the kustomize
tree use, and Helm's. Pod templates and selectors carry the name only, so that an install moved
from deploy/default to the chart keeps its Deployment's (immutable) selector.
*/}}
{{- define "kvcluster-operator.labels" -}}
app.kubernetes.io/name: kvcluster-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The operator's image: repository with the digest, else the tag, else the chart's appVersion. */}}
{{- define "kvcluster-operator.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* A file the chart ships unchanged, parsed; `make generate` copies them from deploy/. */}}
{{- define "kvcluster-operator.file" -}}
{{- $doc := .context.Files.Get .path | fromYaml -}}
{{- if hasKey $doc "Error" }}{{ fail (printf "%s: %s" .path $doc.Error) }}{{ end -}}
{{- toYaml $doc -}}
{{- end }}
