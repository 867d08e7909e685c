{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "gpuplace.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name prefix: RELEASE-gpuplace, or RELEASE when it already says gpuplace. */}}
{{- define "gpuplace.fullname" -}}
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

{{/* Selector labels: stable across upgrades, so no version in them. Pass (dict "ctx" $ "component" "x"). */}}
{{- define "gpuplace.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuplace.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Common labels: selector labels plus chart, version and manager. */}}
{{- define "gpuplace.labels" -}}
{{ include "gpuplace.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: gpuplace
{{- end }}

{{- define "gpuplace.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "gpuplace.extender.name" -}}{{ include "gpuplace.fullname" . }}-extender{{- end }}
{{- define "gpuplace.scheduler.name" -}}{{ include "gpuplace.fullname" . }}-scheduler{{- end }}
{{- define "gpuplace.agent.name" -}}{{ include "gpuplace.fullname" . }}-agent{{- end }}
{{- define "gpuplace.policy.name" -}}{{ include "gpuplace.fullname" . }}-policy{{- end }}

{{/* The URL kube-scheduler calls: the extender Service's cluster DNS name. */}}
{{- define "gpuplace.extender.url" -}}
http://{{ include "gpuplace.extender.name" . }}.{{ .Release.Namespace }}.svc:{{ .Values.extender.port }}
{{- end }}

{{/* kube-scheduler image: the cluster's vMAJOR.MINOR.PATCH (provider suffixes such as -eks-1 dropped). */}}
{{- define "gpuplace.scheduler.image" -}}
{{- $tag := .Values.scheduler.image.tag }}
{{- if not $tag }}
{{- $tag = regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version }}
{{- end }}
{{- printf "%s:%s" .Values.scheduler.image.repository $tag }}
{{- end }}

{{/* The `extenders:` entry of a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1). */}}
{{- define "gpuplace.scheduler.extenders" -}}
extenders:
- urlPrefix: {{ include "gpuplace.extender.url" . }}
  filterVerb: filter
  prioritizeVerb: prioritize
  weight: {{ .Values.scheduler.extender.weight }}
  nodeCacheCapable: {{ .Values.scheduler.extender.nodeCacheCapable }}
  enableHTTPS: false
  httpTimeout: {{ .Values.scheduler.extender.httpTimeoutSeconds }}s
  ignorable: {{ .Values.scheduler.extender.ignorable }}
  managedResources:
  {{- range .Values.scheduler.extender.managedResources }}
  - {name: {{ . }}, ignoredByScheduler: false}
  {{- end }}
{{- end }}

{{/* Restricted-profile container security context. */}}
{{- define "gpuplace.securityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end }}
