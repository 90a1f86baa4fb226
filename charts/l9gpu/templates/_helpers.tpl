{{/* Name of the chart, overridable. */}}
{{- define "l9gpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified name: release-chart, or the release name when it already contains the chart name. */}}
{{- define "l9gpu.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "l9gpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "l9gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "l9gpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "l9gpu.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: node-agent
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* A probe from values; HTTPS when the web config turns TLS on (the kubelet does not verify the certificate). */}}
{{- define "l9gpu.probe" -}}
{{- $probe := deepCopy .probe -}}
{{- if and .root.Values.webConfig.secretName .root.Values.webConfig.tls $probe.httpGet -}}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" -}}
{{- end -}}
{{- toYaml $probe -}}
{{- end }}

{{- define "l9gpu.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "l9gpu.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}
