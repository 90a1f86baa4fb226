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

{{/*
A probe from values. Helm merges a user's probe into the default one, so a tcpSocket, exec
or grpc handler given in values replaces the default httpGet (a probe has one handler).
HTTPS when the web config turns TLS on (the kubelet does not verify the certificate).
*/}}
{{- define "l9gpu.probe" -}}
{{- $probe := deepCopy .probe -}}
{{- if or $probe.tcpSocket $probe.exec $probe.grpc -}}
{{- $_ := unset $probe "httpGet" -}}
{{- end -}}
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

{{/* The image reference: repository:tag, or repository@digest when a digest is set. */}}
{{- define "l9gpu.image" -}}
{{- if not .Values.image.repository -}}
{{- fail "image.repository is not set: no l9gpu image is published. Build one from the repository's Dockerfile, push it to your registry and install with --set image.repository=REGISTRY/l9gpu (README.md, Install)" -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%v" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end }}

{{/* --kubernetes: auto, on or off; a values file's bare on/off arrives as a YAML boolean. */}}
{{- define "l9gpu.kubernetesMode" -}}
{{- $mode := .Values.kubernetesApi -}}
{{- if kindIs "bool" $mode -}}
{{- ternary "on" "off" $mode -}}
{{- else -}}
{{- $mode -}}
{{- end -}}
{{- end }}

{{/*
The container's securityContext from values, plus the capabilities a backend needs: the
Gaudi backend finds its processes by reading every /proc/<pid>/fd/* link, which needs
CAP_SYS_PTRACE (another process's fd links) and CAP_DAC_READ_SEARCH (the fd directories of
other users' processes). NVIDIA and AMD need neither. The kernel log needs CAP_SYSLOG
(kernel.dmesg_restrict=1) and, with kernelLog.privileged, a privileged container: the
runtime's device cgroup refuses a mounted /dev/kmsg to any other (the API server refuses
privileged with allowPrivilegeEscalation false, so that goes too).
*/}}
{{- define "l9gpu.securityContext" -}}
{{- $context := deepCopy (.Values.securityContext | default dict) -}}
{{- $needed := list -}}
{{- if has "gaudi" (splitList "," .Values.backend) -}}
{{- $needed = concat $needed (list "SYS_PTRACE" "DAC_READ_SEARCH") -}}
{{- end -}}
{{- if and .Values.kernelLog.enabled (eq .Values.kernelLog.source "kmsg") -}}
{{- $needed = append $needed "SYSLOG" -}}
{{- if .Values.kernelLog.privileged -}}
{{- $_ := set $context "privileged" true -}}
{{- $_ := set $context "allowPrivilegeEscalation" true -}}
{{- end -}}
{{- end -}}
{{- if $needed -}}
{{- $capabilities := get $context "capabilities" | default dict -}}
{{- $add := concat (get $capabilities "add" | default list) $needed | uniq -}}
{{- $_ := set $capabilities "add" $add -}}
{{- $_ := set $context "capabilities" $capabilities -}}
{{- end -}}
{{- with $context.capabilities -}}
{{- if not .add -}}
{{- $_ := unset . "add" -}}
{{- end -}}
{{- end -}}
{{- toYaml $context -}}
{{- end }}
