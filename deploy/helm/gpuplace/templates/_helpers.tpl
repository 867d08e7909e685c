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
{{/* The Lease (coordination.k8s.io/v1, release namespace) the extender replicas elect the one that
     preempts with (--preemption-lease); its Role grants get/update on this name only. */}}
{{- define "gpuplace.extender.preemptionLease" -}}{{ include "gpuplace.extender.name" . }}-preemption{{- end }}

{{/* Whether the extender preempts (--preemption): extender.preemption.enabled, with
     extender.requeue.enabled, which it needs (it preempts for the pods the requeue remembers, and
     gpuplace-extender refuses --preemption with --no-requeue-rejected-pods); without requeue it is
     ignored, as tls.clientAuth is without TLS. "true" or "". */}}
{{- define "gpuplace.extender.preempts" -}}
{{- if and .Values.extender.requeue.enabled .Values.extender.preemption.enabled }}true{{ end }}
{{- end }}

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

{{/* Whether the chart generates the serving certificate, and kube-scheduler's client certificate
     (extender.tls with neither a Secret of the user's nor cert-manager): "true" or "". */}}
{{- define "gpuplace.extender.generatesServingCert" -}}
{{- with .Values.extender.tls }}{{ if and .enabled (not .certManager.enabled) (not .secretName) }}true{{ end }}{{ end }}
{{- end }}
{{- define "gpuplace.extender.generatesClientCert" -}}
{{- with .Values.extender.tls }}{{ if and .enabled .clientAuth.enabled (not .certManager.enabled) (not .clientAuth.secretName) }}true{{ end }}{{ end }}
{{- end }}

{{/* Secret with the extender's serving certificate (tls.crt, tls.key, ca.crt). The generated one
     has a name of its own, so that switching to cert-manager never has Helm delete the Secret that
     cert-manager fills. */}}
{{- define "gpuplace.extender.tlsSecret" -}}
{{- if .Values.extender.tls.certManager.enabled }}{{ include "gpuplace.extender.name" . }}-tls
{{- else if .Values.extender.tls.secretName }}{{ .Values.extender.tls.secretName }}
{{- else }}{{ include "gpuplace.extender.name" . }}-generated-tls{{ end }}
{{- end }}

{{/* Secret with kube-scheduler's client certificate for the extender (extender.tls.clientAuth). */}}
{{- define "gpuplace.extender.clientSecret" -}}
{{- if .Values.extender.tls.certManager.enabled }}{{ include "gpuplace.scheduler.name" . }}-client-tls
{{- else if .Values.extender.tls.clientAuth.secretName }}{{ .Values.extender.tls.clientAuth.secretName }}
{{- else }}{{ include "gpuplace.scheduler.name" . }}-generated-client-tls{{ end }}
{{- end }}

{{/* The certificates the chart generates, as JSON {"serving": DATA, "client": DATA} where DATA is a
     Secret's base64 data (tls.crt, tls.key, ca.crt); a key only where that certificate is generated.
     `helm upgrade` reuses the Secret already in the cluster (lookup): a new certificate at every
     upgrade would break the trust between the running extender and kube-scheduler. Each certificate
     has a CA of its own, whose key is dropped once it has signed: nothing can sign another
     certificate either side trusts, and the serving certificate cannot pass as a client one (Sprig's
     genSignedCert marks every certificate for server and client auth). Generated once per render and
     kept on the root context, so that every template (the Secrets, the pods' checksums) sees the same. */}}
{{- define "gpuplace.extender.generatedTLS" -}}
{{- if not (hasKey $ "gpuplaceGeneratedTLS") }}
{{- $out := dict }}
{{- $ns := .Release.Namespace }}
{{- if include "gpuplace.extender.generatesServingCert" . }}
{{- $secret := include "gpuplace.extender.tlsSecret" . }}
{{- $data := (lookup "v1" "Secret" $ns $secret).data | default dict }}
{{- if not (and (index $data "tls.crt") (index $data "tls.key") (index $data "ca.crt")) }}
{{- $name := include "gpuplace.extender.name" . }}
{{- $host := include "gpuplace.extender.host" . }}
{{- $ca := genCA (printf "%s-ca" $name) 3650 }}
{{- $cert := genSignedCert $host nil (list $name (printf "%s.%s" $name $ns) $host (printf "%s.cluster.local" $host)) 730 $ca }}
{{- $data = dict "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) "ca.crt" ($ca.Cert | b64enc) }}
{{- end }}
{{- $_ := set $out "serving" (pick $data "tls.crt" "tls.key" "ca.crt") }}
{{- end }}
{{- if include "gpuplace.extender.generatesClientCert" . }}
{{- $secret := include "gpuplace.extender.clientSecret" . }}
{{- $data := (lookup "v1" "Secret" $ns $secret).data | default dict }}
{{- if not (and (index $data "tls.crt") (index $data "tls.key") (index $data "ca.crt")) }}
{{- $name := include "gpuplace.scheduler.name" . }}
{{- $ca := genCA (printf "%s-client-ca" $name) 3650 }}
{{- $cert := genSignedCert $name nil nil 730 $ca }}
{{- $data = dict "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) "ca.crt" ($ca.Cert | b64enc) }}
{{- end }}
{{- $_ := set $out "client" (pick $data "tls.crt" "tls.key" "ca.crt") }}
{{- end }}
{{- $_ := set $ "gpuplaceGeneratedTLS" $out }}
{{- end }}
{{- toJson (get $ "gpuplaceGeneratedTLS") }}
{{- end }}

{{/* A checksum of the generated certificates for a pod template's annotations: the pods roll when
     the chart generates new ones (after the Secrets were deleted to rotate them), since kube-scheduler
     reads its CA and client certificate only at start. Empty when the chart generates none. */}}
{{- define "gpuplace.extender.generatedTLSChecksum" -}}
{{- if or (include "gpuplace.extender.generatesServingCert" .) (include "gpuplace.extender.generatesClientCert" .) }}
{{- include "gpuplace.extender.generatedTLS" . | sha256sum }}
{{- end }}
{{- end }}

{{/* Whether the extender serves the ResourceClaim webhook (--claim-webhook-port): extender.dra with
     its webhook on; validations.yaml refuses it without extender.tls. "true" or "". */}}
{{- define "gpuplace.extender.claimWebhook" -}}
{{- with .Values.extender.dra }}{{ if and .enabled .webhook.enabled }}true{{ end }}{{ end }}
{{- end }}

{{/* Whether kube-apiserver also sends the extender the pods that opt in with the label
     gpuplace.io/dra: "true" (webhook pods.gpuplace.io, POST /mutate/pods), for which it creates the
     ResourceClaimTemplates gpuplace-gpu-<N> (RBAC in extender-rbac.yaml, narrowed by
     extender-claim-templates-admission.yaml): the claim webhook with extender.dra.webhook.pods.
     "true" or "". */}}
{{- define "gpuplace.extender.podWebhook" -}}
{{- if and (include "gpuplace.extender.claimWebhook" .) .Values.extender.dra.webhook.pods }}true{{ end }}
{{- end }}

{{/* The ConfigMap with extender.dra.drivers (--dra-drivers), and where the extender mounts it. */}}
{{- define "gpuplace.extender.draDriversConfigMap" -}}{{ include "gpuplace.extender.name" . }}-dra-drivers{{- end }}
{{- define "gpuplace.extender.draDriversDir" -}}/etc/gpuplace/dra{{- end }}

{{/* The base64 PEM of the CA that signed the extender's serving certificate, for a webhook's
     clientConfig.caBundle (kube-apiserver trusts nothing else there): the generated Secret's ca.crt
     (the same render's, see "gpuplace.extender.generatedTLS"), else extender.tls.caBundle, else ca.crt
     of extender.tls.secretName read from the cluster (lookup; empty where the renderer has no
     cluster). Empty with cert-manager, whose cainjector fills caBundle from the Certificate
     (annotation cert-manager.io/inject-ca-from), and without TLS. */}}
{{- define "gpuplace.extender.webhookCABundle" -}}
{{- with .Values.extender.tls }}
{{- if and .enabled (not .certManager.enabled) }}
{{- if include "gpuplace.extender.generatesServingCert" $ }}
{{- index (include "gpuplace.extender.generatedTLS" $ | fromJson).serving "ca.crt" }}
{{- else if .caBundle }}
{{- .caBundle | b64enc }}
{{- else }}
{{- index ((lookup "v1" "Secret" $.Release.Namespace .secretName).data | default dict) "ca.crt" | default "" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Whether the `helm test` Pod calls the extender's main port (it holds no client certificate):
     without TLS, or over HTTPS when the extender demands no client certificate; "true" or "". */}}
{{- define "gpuplace.test.callsMainPort" -}}
{{- with .Values.extender.tls }}{{ if or (not .enabled) (and (not .clientAuth.enabled) (not .insecureSkipVerify)) }}true{{ end }}{{ end }}
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
  {{- if not .Values.extender.filterReturnsBest }}
  prioritizeVerb: prioritize
  weight: {{ .Values.scheduler.extender.weight }}
  {{- end }}
  {{- if .Values.extender.preemption.enabled }}
  {{- /* kube-scheduler's own preemption, where its count finds victims: the extender keeps the
  victim sets that make room by its filter and drops the others (POST /preempt). */}}
  preemptVerb: preempt
  {{- end }}
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
  {{- if not (and .Values.scheduler.enabled .Values.scheduler.extender.cpuOnlyPods) }}
  {{- /* With managedResources, kube-scheduler calls the extender only for pods that request one
  (pkg/scheduler/extender.go IsInterested); without, for every pod of that scheduler: only the
  chart's own scheduler, which pods opt into, goes without (never a snippet for your scheduler). */}}
  managedResources:
  {{- range .Values.scheduler.extender.managedResources }}
  - {name: {{ . }}, ignoredByScheduler: false}
  {{- end }}
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
