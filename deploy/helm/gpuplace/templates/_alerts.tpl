{{/* Alert rule groups (Prometheus rule-file format). Used by prometheusrule.yaml; the tests check the
     same text with `promtool check rules`. */}}
{{- define "gpuplace.alertGroups" -}}
{{- $timeout := .Values.scheduler.extender.httpTimeoutSeconds }}
{{- $stale := .Values.prometheusRule.staleInventorySeconds }}
groups:
- name: gpuplace-extender
  rules:
  - alert: GpuplaceExtenderErrors
    expr: |
      sum(rate(gpuplace_extender_requests_total{code=~"5.."}[5m]))
        / sum(rate(gpuplace_extender_requests_total[5m])) > 0.01
    for: 5m
    labels: {severity: critical}
    annotations:
      summary: More than 1 % of extender calls fail with HTTP 5xx.
      description: '{{`{{ $value | humanizePercentage }}`}} of /filter and /prioritize calls failed in the last 5 minutes; GPU pods may not be scheduled. Check the extender logs.'
  - alert: GpuplaceFilterLatencyNearTimeout
    expr: |
      histogram_quantile(0.99, sum by (le) (rate(gpuplace_extender_request_duration_seconds_bucket{verb="filter"}[5m])))
        > {{ mulf $timeout .Values.prometheusRule.filterLatencyTimeoutRatio }}
    for: 10m
    labels: {severity: warning}
    annotations:
      summary: Filter p99 latency is close to kube-scheduler's {{ $timeout }}s extender timeout.
      description: 'p99 of /filter is {{`{{ $value | humanizeDuration }}`}}; a filter call that times out fails the pod''s scheduling cycle.'
  - alert: GpuplaceExtenderCacheNotSynced
    expr: max by (instance) (gpuplace_extender_cache_synced) == 0
    for: 5m
    labels: {severity: critical}
    annotations:
      summary: An extender has not synced Nodes and Pods with the API server.
      description: '{{`{{ $labels.instance }}`}} is not ready: it cannot list or watch Nodes/Pods (RBAC, network, API server).'
  - alert: GpuplacePolicyRejected
    expr: increase(gpuplace_extender_policy_reloads_total{result="rejected"}[15m]) > 0
    labels: {severity: warning}
    annotations:
      summary: A policy edit was rejected; the previous policy is still in force.
      description: 'See the Events of the policy ConfigMap (reason PolicyRejected) for the field that is wrong.'
  - alert: GpuplaceRequeueForbidden
    expr: sum(increase(gpuplace_extender_requeued_pods_total{result="forbidden"}[15m])) > 0
    labels: {severity: warning}
    annotations:
      summary: The extender may not requeue waiting pods.
      description: 'The API server refused {{`{{ $value }}`}} requeue marks in 15 minutes (RBAC patch on pods, or an admission policy); waiting pods are retried only by kube-scheduler''s periodic flush.'
- name: gpuplace-inventory
  rules:
  - alert: GpuplaceInventoryStale
    expr: max by (node) (gpuplace_extender_inventory_age_seconds) > {{ $stale }}
    for: 5m
    labels: {severity: warning}
    annotations:
      summary: A node's GPU inventory is older than {{ $stale }}s.
      description: 'The agent on {{`{{ $labels.node }}`}} has not published for {{`{{ $value | humanizeDuration }}`}}; the policy may reject the node for GPU pods.'
  - alert: GpuplaceInventoryInvalid
    expr: max(gpuplace_cluster_nodes{inventory="invalid"}) > 0
    for: 10m
    labels: {severity: warning}
    annotations:
      summary: Some nodes carry an inventory annotation the extender rejects.
      description: '{{`{{ $value }}`}} nodes fail GPU pods with the validation message; check their agents.'
  - alert: GpuplaceGPUUnhealthy
    expr: gpuplace_gpu_healthy == 0
    for: 5m
    labels: {severity: warning}
    annotations:
      summary: A GPU is marked unhealthy and gets no work.
      description: 'GPU {{`{{ $labels.gpu_uuid }}`}} on {{`{{ $labels.node }}`}} is unhealthy (XID errors, ECC, fallen off the bus).'
  - alert: GpuplaceAgentPublishFailing
    expr: time() - gpuplace_agent_last_publish_timestamp_seconds > {{ $stale }}
    for: 5m
    labels: {severity: warning}
    annotations:
      summary: An agent has not patched its Node for {{ $stale }}s.
      description: 'Agent {{`{{ $labels.instance }}`}} cannot publish (RBAC get/patch nodes, API server reachability).'
{{- end }}
