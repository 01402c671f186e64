{{/*
The containers' environment: the chart's variables, then agent.extraEnv /
controller.extraEnv. A variable of extraEnv with the name of one the chart
sets replaces it (one entry per name: a second entry of the same name is
refused by server-side apply as "duplicate entries for key").
*/}}
{{- define "mountguard.env" -}}
{{- $names := dict -}}
{{- range .extra }}{{ $_ := set $names .name true }}{{ end -}}
{{- range (fromYamlArray .chart) }}
{{- if not (hasKey $names .name) }}
- {{ toYaml . | indent 2 | trim }}
{{- end }}
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "mountguard.agent.chartEnv" -}}
{{- $tls := eq (include "mountguard.tlsEnabled" .) "true" -}}
- name: MOUNTGUARD_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: MOUNTGUARD_KUBELET_ROOT
  value: {{ .Values.agent.kubeletRootDir | quote }}
- name: MOUNTGUARD_LISTEN
  value: {{ printf "0.0.0.0:%d" (int .Values.agent.listenPort) | quote }}
- name: MOUNTGUARD_RESCAN_INTERVAL
  value: {{ .Values.agent.rescanInterval | quote }}
- name: MOUNTGUARD_MAX_FILE_SIZE
  value: {{ include "mountguard.size" .Values.agent.maxFileSize | quote }}
- name: MOUNTGUARD_CONTROLLER_URL
  value: {{ include "mountguard.controllerURL" . | quote }}
- name: MOUNTGUARD_TOKEN_FILE
  value: /var/run/secrets/mountguard/token
{{- if $tls }}
- name: MOUNTGUARD_CA_FILE
  value: /var/run/secrets/mountguard/ca.crt
{{- end }}
- name: MOUNTGUARD_HEARTBEAT_INTERVAL
  value: {{ .Values.agent.heartbeatInterval | quote }}
- name: MOUNTGUARD_LOG_FORMAT
  value: {{ .Values.agent.logFormat | quote }}
- name: MOUNTGUARD_LOG
  value: {{ .Values.agent.logLevel | quote }}
{{- end -}}

{{- define "mountguard.controller.chartEnv" -}}
{{- $tls := eq (include "mountguard.tlsEnabled" .) "true" -}}
{{- $leader := eq (include "mountguard.leaderElection" .) "true" -}}
{{- $mode := include "mountguard.remediationMode" . -}}
{{- $r := .Values.remediation -}}
{{- $token := $r.slurmrestd.tokenSecret -}}
{{- $jwtKey := $r.slurmrestd.jwtKeySecret -}}
- name: MOUNTGUARD_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: MOUNTGUARD_POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
# The controller's allocator (mimalloc): give freed memory back
# at once and commit arenas as they are used (docs/performance.md).
- name: MIMALLOC_PURGE_DELAY
  value: "0"
- name: MIMALLOC_ARENA_EAGER_COMMIT
  value: "0"
{{- with .Values.controller.watchNamespaces }}
- name: MOUNTGUARD_WATCH_NAMESPACES
  value: {{ join "," . | quote }}
{{- end }}
{{- with .Values.controller.podSelector }}
- name: MOUNTGUARD_POD_SELECTOR
  value: {{ . | quote }}
{{- end }}
- name: MOUNTGUARD_REPORT_LISTEN
  value: {{ printf "0.0.0.0:%d" (int .Values.controller.reportPort) | quote }}
{{- if $tls }}
- name: MOUNTGUARD_TLS_CERT_FILE
  value: /var/run/mountguard/tls/tls.crt
- name: MOUNTGUARD_TLS_KEY_FILE
  value: /var/run/mountguard/tls/tls.key
{{- else }}
- name: MOUNTGUARD_INSECURE_PLAINTEXT_REPORTS
  value: "true"
{{- end }}
- name: MOUNTGUARD_METRICS_LISTEN
  value: {{ printf "0.0.0.0:%d" (int .Values.controller.metricsPort) | quote }}
{{- if eq (include "mountguard.admission.enabled" .) "true" }}
- name: MOUNTGUARD_ADMISSION_LISTEN
  value: {{ printf "0.0.0.0:%d" (int .Values.admission.port) | quote }}
- name: MOUNTGUARD_ADMISSION_MODE
  value: {{ .Values.admission.mode | quote }}
- name: MOUNTGUARD_ADMISSION_TLS_CERT_FILE
  value: /var/run/mountguard/admission-tls/tls.crt
- name: MOUNTGUARD_ADMISSION_TLS_KEY_FILE
  value: /var/run/mountguard/admission-tls/tls.key
- name: MOUNTGUARD_ADMISSION_ANSWER_TIMEOUT
  value: {{ .Values.admission.answerTimeout | quote }}
{{- if .Values.admission.clientCA.configMap }}
- name: MOUNTGUARD_ADMISSION_CLIENT_CA_FILE
  value: /var/run/mountguard/admission-client-ca/ca.crt
{{- end }}
{{- end }}
- name: MOUNTGUARD_STATUS_AUTH
  value: {{ .Values.controller.statusAuth | quote }}
- name: MOUNTGUARD_TOKEN_AUDIENCE
  value: {{ .Values.controller.tokenAudience | quote }}
- name: MOUNTGUARD_AGENT_SERVICE_ACCOUNT
  value: {{ printf "%s:%s" .Release.Namespace (include "mountguard.agent.fullname" .) | quote }}
- name: MOUNTGUARD_AGENT_DAEMONSET
  value: {{ include "mountguard.agent.fullname" . | quote }}
- name: MOUNTGUARD_GRACE
  value: {{ .Values.controller.grace | quote }}
- name: MOUNTGUARD_INVENTORY_MAX_AGE
  value: {{ .Values.controller.inventoryMaxAge | quote }}
- name: MOUNTGUARD_FINGERPRINT_KEY_FILE
  value: /var/run/mountguard/fingerprint/key
- name: MOUNTGUARD_MAX_REPORT_BYTES
  value: {{ include "mountguard.size" .Values.controller.maxReportBytes | quote }}
- name: MOUNTGUARD_REPORT_RATE_LIMIT
  value: {{ .Values.controller.reportRateLimit | quote }}
- name: MOUNTGUARD_REPORT_BODY_TIMEOUT
  value: {{ .Values.controller.reportBodyTimeout | quote }}
- name: MOUNTGUARD_MAX_CONNECTIONS
  value: {{ .Values.controller.maxConnections | int64 | quote }}
- name: MOUNTGUARD_HEADER_READ_TIMEOUT
  value: {{ .Values.controller.headerReadTimeout | quote }}
- name: MOUNTGUARD_IDLE_TIMEOUT
  value: {{ .Values.controller.idleTimeout | quote }}
- name: MOUNTGUARD_LEADER_ELECTION
  value: {{ $leader | quote }}
{{- if $leader }}
- name: MOUNTGUARD_LEASE_NAME
  value: {{ .Values.controller.leaderElection.leaseName | quote }}
{{- end }}
- name: MOUNTGUARD_REMEDIATION
  value: {{ $mode | quote }}
{{- if ne $mode "off" }}
{{- if $r.workloads.kinds }}
- name: MOUNTGUARD_REMEDIATE_WORKLOADS
  value: {{ join "," $r.workloads.kinds | quote }}
- name: MOUNTGUARD_REMEDIATION_BUDGET_WORKLOADS
  value: {{ $r.workloads.budget | quote }}
{{- end }}
{{- if $r.slurmrestd.url }}
- name: MOUNTGUARD_SLURMRESTD_URL
  value: {{ $r.slurmrestd.url | quote }}
{{- if $r.slurmrestd.caSecret.name }}
- name: MOUNTGUARD_SLURMRESTD_CA_FILE
  value: /var/run/mountguard/slurmrestd-ca/ca.crt
{{- end }}
{{- if $jwtKey.name }}
- name: MOUNTGUARD_SLURM_JWT_KEY_SECRET
  value: {{ printf "%s/%s" (default .Release.Namespace $jwtKey.namespace) $jwtKey.name | quote }}
- name: MOUNTGUARD_SLURM_USER
  value: {{ $r.slurmrestd.user | quote }}
{{- else }}
- name: MOUNTGUARD_SLURM_TOKEN_SECRET
  value: {{ printf "%s/%s" (default .Release.Namespace $token.namespace) $token.name | quote }}
- name: MOUNTGUARD_SLURM_TOKEN_KEY
  value: {{ $token.key | quote }}
{{- end }}
{{- end }}
- name: MOUNTGUARD_REMEDIATION_BUDGET_PER_NODESET
  value: {{ $r.budgetPerNodeSet | quote }}
- name: MOUNTGUARD_REMEDIATION_BUDGET_CLUSTER
  value: {{ $r.budgetCluster | quote }}
- name: MOUNTGUARD_REMEDIATION_DELAY
  value: {{ $r.delay | quote }}
- name: MOUNTGUARD_DRAIN_TIMEOUT
  value: {{ $r.drainTimeout | quote }}
- name: MOUNTGUARD_REPLACEMENT_TIMEOUT
  value: {{ $r.replacementTimeout | quote }}
- name: MOUNTGUARD_EVICTION_TIMEOUT
  value: {{ $r.evictionTimeout | quote }}
- name: MOUNTGUARD_NODE_HOLD_TIMEOUT
  value: {{ $r.nodeHoldTimeout | quote }}
- name: MOUNTGUARD_VERIFICATION_TIMEOUT
  value: {{ $r.verificationTimeout | quote }}
- name: MOUNTGUARD_SLURM_NOT_FOUND_GRACE
  value: {{ $r.slurmNotFoundGrace | quote }}
- name: MOUNTGUARD_ON_FAILURE
  value: {{ $r.onFailure | quote }}
- name: MOUNTGUARD_REPLACE_PINNING_PODS
  value: {{ $r.replacePinningPods | quote }}
- name: MOUNTGUARD_DRAIN_STATE
  value: {{ $r.drainState | quote }}
- name: MOUNTGUARD_ABSENT_SLURM_NODE
  value: {{ $r.absentSlurmNode | quote }}
{{- end }}
- name: MOUNTGUARD_LOG_FORMAT
  value: {{ .Values.controller.logFormat | quote }}
- name: MOUNTGUARD_LOG
  value: {{ .Values.controller.logLevel | quote }}
{{- end -}}
