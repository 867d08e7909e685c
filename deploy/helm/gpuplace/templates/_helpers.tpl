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

{{/* ServiceAccount names: `<component>.serviceAccount.name`, default the component's resource name,
     whether the chart creates the account or not (RBAC bindings and admission policies name it). */}}
{{- define "gpuplace.extender.serviceAccountName" -}}
{{- .Values.extender.serviceAccount.name | default (include "gpuplace.extender.name" .) }}
{{- end }}
{{- define "gpuplace.scheduler.serviceAccountName" -}}
{{- .Values.scheduler.serviceAccount.name | default (include "gpuplace.scheduler.name" .) }}
{{- end }}
{{- define "gpuplace.agent.serviceAccountName" -}}
{{- .Values.agent.serviceAccount.name | default (include "gpuplace.agent.name" .) }}
{{- end }}

{{/* Where the agent reads agent.fakeInventory (probe: fake), from the ConfigMap of that name. */}}
{{- define "gpuplace.agent.fakeInventoryDir" -}}/etc/gpuplace/fake-inventory{{- end }}
{{- define "gpuplace.agent.fakeInventoryConfigMap" -}}{{ include "gpuplace.agent.name" . }}-fake-inventory{{- end }}

{{/* The URL kube-scheduler calls: the extender Service's cluster DNS name (https with extender.tls). */}}
{{- define "gpuplace.extender.url" -}}
{{ ternary "https" "http" .Values.extender.tls.enabled }}://{{ include "gpuplace.extender.host" . }}:{{ .Values.extender.port }}
{{- end }}

{{/* The extender Service's DNS name; the serving certificate must name it. */}}
{{- define "gpuplace.extender.host" -}}
{{ include "gpuplace.extender.name" . }}.{{ .Release.Namespace }}.svc
{{- end }}

{{/* Secret with the extender's serving certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "gpuplace.extender.tlsSecret" -}}
{{- if .Values.extender.tls.certManager.enabled }}{{ include "gpuplace.extender.name" . }}-tls
{{- else }}{{ .Values.extender.tls.secretName }}{{ end }}
{{- end }}

{{/* Secret with kube-scheduler's client certificate for the extender (extender.tls.clientAuth). */}}
{{- define "gpuplace.extender.clientSecret" -}}
{{- if .Values.extender.tls.certManager.enabled }}{{ include "gpuplace.scheduler.name" . }}-client-tls
{{- else }}{{ .Values.extender.tls.clientAuth.secretName }}{{ end }}
{{- end }}

{{/* Whether the chart's kube-scheduler reads the extender's CA from the serving Secret's ca.crt. */}}
{{- define "gpuplace.scheduler.extenderCAFromSecret" -}}
{{- with .Values.extender.tls }}{{ if and .enabled (not .caBundle) (not .insecureSkipVerify) }}true{{ end }}{{ end }}
{{- end }}

{{/* Where the chart's kube-scheduler mounts the extender's CA and its client certificate. */}}
{{- define "gpuplace.scheduler.extenderCADir" -}}/etc/kubernetes/gpuplace-scheduler/extender-ca{{- end }}
{{- define "gpuplace.scheduler.clientCertDir" -}}/etc/kubernetes/gpuplace-scheduler/extender-client{{- end }}

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
  enableHTTPS: {{ .Values.extender.tls.enabled }}
  {{- with .Values.extender.tls }}
  {{- if .enabled }}
  tlsConfig:
    insecure: {{ .insecureSkipVerify }}
    {{- /* kube-scheduler refuses a CA together with insecure, and with enableHTTPS and no CA it
    silently skips verification (pkg/scheduler/extender.go makeTransport): a CA is always set here. */}}
    {{- if .insecureSkipVerify }}
    {{- else if .caBundle }}
    caData: {{ .caBundle | b64enc }}
    {{- else }}
    caFile: {{ include "gpuplace.scheduler.extenderCADir" $ }}/ca.crt
    {{- end }}
    {{- if .clientAuth.enabled }}
    certFile: {{ include "gpuplace.scheduler.clientCertDir" $ }}/tls.crt
    keyFile: {{ include "gpuplace.scheduler.clientCertDir" $ }}/tls.key
    {{- end }}
  {{- end }}
  {{- end }}
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
