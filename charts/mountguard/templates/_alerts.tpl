{{/*
The alerting rules, one template each, in their groups. prometheusrule.yaml
renders the groups, leaving out the alerts listed in
metrics.prometheusRule.disabled and empty groups.
*/}}
{{- define "mountguard.alertGroups" -}}
mountguard.mounts: [MountguardStaleMount, MountguardKubeletCachePinned, MountguardFrozenMount]
mountguard.components: [MountguardAgentNotReporting, MountguardAgentCannotRead, MountguardControllerDown, MountguardReportRejections]
mountguard.remediation: [MountguardRemediationFailed, MountguardRemediationUnresolved, MountguardRemediationStuck]
{{- end -}}

{{- define "mountguard.alert.MountguardStaleMount" -}}
{{- $p := .Values.metrics.prometheusRule -}}
{{- $base := trimSuffix "/" $p.runbookBaseURL -}}
- alert: MountguardStaleMount
  expr: |-
    max by (namespace, pod, node, volume, source_kind, source_name, cause) (
      mountguard_mount_state{state="Stale", cause!="ImmutableCachePinned"}
    ) > 0
  for: {{ $p.for.staleMount }}
  labels:
    severity: warning
    {{- with $p.alertLabels }}{{ toYaml . | nindent 4 }}{{- end }}
  annotations:
    summary: Pod {{`{{ $labels.namespace }}/{{ $labels.pod }}`}} is served stale content
    description: >-
      Volume {{`{{ $labels.volume }}`}} of pod {{`{{ $labels.namespace }}/{{ $labels.pod }}`}}
      on node {{`{{ $labels.node }}`}} differs from {{`{{ $labels.source_kind }} {{ $labels.source_name }}`}}
      in the API server past the grace period (cause {{`{{ $labels.cause }}`}}).
    runbook_url: {{ $base }}/mountguard-stale-mount.md
{{- end -}}

{{- define "mountguard.alert.MountguardKubeletCachePinned" -}}
{{- $p := .Values.metrics.prometheusRule -}}
{{- $base := trimSuffix "/" $p.runbookBaseURL -}}
- alert: MountguardKubeletCachePinned
  expr: |-
    max by (namespace, pod, node, volume, source_kind, source_name) (
      mountguard_mount_state{state="Stale", cause="ImmutableCachePinned"}
    ) > 0
  for: {{ $p.for.kubeletCachePinned }}
  labels:
    severity: warning
    {{- with $p.alertLabels }}{{ toYaml . | nindent 4 }}{{- end }}
  annotations:
    summary: Kubelet on {{`{{ $labels.node }}`}} serves a recreated immutable {{`{{ $labels.source_kind }}`}} from its cache
    description: >-
      {{`{{ $labels.source_kind }} {{ $labels.source_name }}`}} was recreated with new content, but other
      pods on node {{`{{ $labels.node }}`}} keep the kubelet's cache entry alive, so pod
      {{`{{ $labels.namespace }}/{{ $labels.pod }}`}} (and any replacement scheduled there) gets the old
      content. Replacing this pod alone does not help.
    runbook_url: {{ $base }}/mountguard-kubelet-cache-pinned.md
{{- end -}}

{{- define "mountguard.alert.MountguardFrozenMount" -}}
{{- $p := .Values.metrics.prometheusRule -}}
{{- $base := trimSuffix "/" $p.runbookBaseURL -}}
- alert: MountguardFrozenMount
  expr: |-
    max by (namespace, pod, node, volume, source_kind, source_name, cause) (
      mountguard_mount_state{state="Frozen"}
    ) > 0
  for: {{ $p.for.frozenMount }}
  labels:
    severity: info
    {{- with $p.alertLabels }}{{ toYaml . | nindent 4 }}{{- end }}
  annotations:
    summary: Pod {{`{{ $labels.namespace }}/{{ $labels.pod }}`}} runs with content older than its source ({{`{{ $labels.cause }}`}})
    description: >-
      {{`{{ $labels.source_kind }} {{ $labels.source_name }}`}} changed after a container of pod
      {{`{{ $labels.namespace }}/{{ $labels.pod }}`}} started, and that container reads it through a
      {{`{{ $labels.cause }}`}} reference that is never refreshed. A container restart is needed.
    runbook_url: {{ $base }}/mountguard-frozen-mount.md
{{- end -}}

{{- define "mountguard.alert.MountguardAgentNotReporting" -}}
{{- $p := .Values.metrics.prometheusRule -}}
{{- $base := trimSuffix "/" $p.runbookBaseURL -}}
- alert: MountguardAgentNotReporting
  expr: |-
    max by (node) (mountguard_node_agent_reporting) == 0
  for: {{ $p.for.agentNotReporting }}
  labels:
    severity: warning
    {{- with $p.alertLabels }}{{ toYaml . | nindent 4 }}{{- end }}
  annotations:
    summary: No mountguard agent reports for node {{`{{ $labels.node }}`}}
    description: >-
      Node {{`{{ $labels.node }}`}} runs pods but the controller has no recent inventory from its
      agent, so the content served there is not verified.
    runbook_url: {{ $base }}/mountguard-agent-not-reporting.md
{{- end -}}

{{- define "mountguard.alert.MountguardAgentCannotRead" -}}
{{- $p := .Values.metrics.prometheusRule -}}
{{- $base := trimSuffix "/" $p.runbookBaseURL -}}
- alert: MountguardAgentCannotRead
  expr: |-
    max by (node, kind) (
      mountguard_agent_read_errors{kind=~"mountPropagation|permission"}
    ) > 0
  for: {{ $p.for.agentCannotRead }}
  labels:
    severity: warning
    {{- with $p.alertLabels }}{{ toYaml . | nindent 4 }}{{- end }}
  annotations:
    summary: The mountguard agent on {{`{{ $labels.node }}`}} cannot read volumes ({{`{{ $labels.kind }}`}})
    description: >-
      The agent reports {{`{{ $value }}`}} {{`{{ $labels.kind }}`}} read errors: the affected volumes are
      Unverifiable. mountPropagation means the kubelet directory is mounted without
      HostToContainer propagation; permission means DAC_READ_SEARCH is missing or blocked.
    runbook_url: {{ $base }}/mountguard-agent-cannot-read.md
{{- end -}}

{{- define "mountguard.alert.MountguardControllerDown" -}}
{{- $p := .Values.metrics.prometheusRule -}}
{{- $base := trimSuffix "/" $p.runbookBaseURL -}}
{{- $ns := .Release.Namespace -}}
- alert: MountguardControllerDown
  expr: |-
    absent(mountguard_leader{namespace="{{ $ns }}"} == 1)
  for: {{ $p.for.controllerDown }}
  labels:
    severity: critical
    {{- with $p.alertLabels }}{{ toYaml . | nindent 4 }}{{- end }}
  annotations:
    summary: No acting mountguard controller in namespace {{ $ns }}
    description: >-
      No controller replica in {{ $ns }} is scraped as the acting replica: reports are not
      received, verdicts and alerts on mount content are not computed.
    runbook_url: {{ $base }}/mountguard-controller-down.md
{{- end -}}

{{- define "mountguard.alert.MountguardReportRejections" -}}
{{- $p := .Values.metrics.prometheusRule -}}
{{- $base := trimSuffix "/" $p.runbookBaseURL -}}
- alert: MountguardReportRejections
  expr: |-
    sum by (result) (
      increase(mountguard_report_requests_total{result=~"unauthenticated|forbidden"}[10m])
    ) > 0
  for: {{ $p.for.reportRejections }}
  labels:
    severity: warning
    {{- with $p.alertLabels }}{{ toYaml . | nindent 4 }}{{- end }}
  annotations:
    summary: The mountguard report API rejects reports ({{`{{ $labels.result }}`}})
    description: >-
      {{`{{ $value | humanize }}`}} reports were rejected as {{`{{ $labels.result }}`}} in the last 10 minutes.
      Either a misconfigured agent (audience, service account) or someone sending
      inventories they are not allowed to send (a forged report for another node).
    runbook_url: {{ $base }}/mountguard-report-rejections.md
{{- end -}}

{{- define "mountguard.alert.MountguardRemediationFailed" -}}
{{- $p := .Values.metrics.prometheusRule -}}
{{- $base := trimSuffix "/" $p.runbookBaseURL -}}
- alert: MountguardRemediationFailed
  expr: |-
    max(mountguard_remediation_failed) > 0
  for: {{ $p.for.remediationFailed }}
  labels:
    severity: warning
    {{- with $p.alertLabels }}{{ toYaml . | nindent 4 }}{{- end }}
  annotations:
    summary: A mountguard remediation failed and left a Slurm node drained
    description: >-
      {{`{{ $value }}`}} remediation attempt(s) ended in Failed with the Slurm node kept drained
      (reason prefixed "mountguard:"). The node takes no jobs until an operator acts.
    runbook_url: {{ $base }}/mountguard-remediation-failed.md
{{- end -}}

{{- define "mountguard.alert.MountguardRemediationUnresolved" -}}
{{- $p := .Values.metrics.prometheusRule -}}
{{- $base := trimSuffix "/" $p.runbookBaseURL -}}
- alert: MountguardRemediationUnresolved
  expr: |-
    max by (owner_kind) (mountguard_remediation_failed_unresolved) > 0
  for: {{ $p.for.remediationUnresolved }}
  labels:
    severity: warning
    {{- with $p.alertLabels }}{{ toYaml . | nindent 4 }}{{- end }}
  annotations:
    summary: A failed mountguard remediation left {{`{{ $labels.owner_kind }}`}} pod(s) not fresh
    description: >-
      {{`{{ $value }}`}} remediation attempt(s) of {{`{{ $labels.owner_kind }}`}} pods ended in Failed and
      the pod they leave behind (the replacement, or the pod itself when it was never evicted)
      still does not see current content. mountguard does not try that pod again: an operator
      has to act.
    runbook_url: {{ $base }}/mountguard-remediation-unresolved.md
{{- end -}}

{{- define "mountguard.alert.MountguardRemediationStuck" -}}
{{- $p := .Values.metrics.prometheusRule -}}
{{- $base := trimSuffix "/" $p.runbookBaseURL -}}
{{- $r := .Values.remediation -}}
{{- $stuck := add (include "mountguard.seconds" $r.delay) (include "mountguard.seconds" $r.drainTimeout) (include "mountguard.seconds" $r.evictionTimeout) (include "mountguard.seconds" $r.replacementTimeout) (include "mountguard.seconds" $r.verificationTimeout) (include "mountguard.seconds" $p.remediationStuckSlack) -}}
- alert: MountguardRemediationStuck
  expr: |-
    max(mountguard_remediation_oldest_open_attempt_age_seconds) > {{ $stuck }}
  for: 5m
  labels:
    severity: warning
    {{- with $p.alertLabels }}{{ toYaml . | nindent 4 }}{{- end }}
  annotations:
    summary: A mountguard remediation has been open longer than its timeouts allow
    description: >-
      The oldest open remediation attempt is {{`{{ $value | humanizeDuration }}`}} old, more than
      delay + drain, eviction, replacement and verification timeouts + slack ({{ $stuck }}s). The controller should
      have finished or failed it.
    runbook_url: {{ $base }}/mountguard-remediation-stuck.md
{{- end -}}
