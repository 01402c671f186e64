{{/* Chart name. */}}
{{- define "mountguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name. */}}
{{- define "mountguard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "mountguard.agent.fullname" -}}{{ include "mountguard.fullname" . }}-agent{{- end -}}
{{- define "mountguard.controller.fullname" -}}{{ include "mountguard.fullname" . }}-controller{{- end -}}
{{- define "mountguard.controller.metricsService" -}}{{ include "mountguard.fullname" . }}-controller-metrics{{- end -}}
{{- define "mountguard.agent.metricsService" -}}{{ include "mountguard.fullname" . }}-agent-metrics{{- end -}}
{{- define "mountguard.tlsSecret" -}}
{{- if .Values.tls.certManager.enabled -}}
{{ include "mountguard.fullname" . }}-controller-tls
{{- else -}}
{{ .Values.tls.existingSecret }}
{{- end -}}
{{- end -}}
{{- define "mountguard.fingerprintSecret" -}}
{{- default (printf "%s-fingerprint-key" (include "mountguard.fullname" .)) .Values.controller.fingerprintKey.existingSecret -}}
{{- end -}}

{{/* Common labels. */}}
{{- define "mountguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "mountguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mountguard
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component ("agent" or "controller"). */}}
{{- define "mountguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mountguard.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/*
An image reference: [global.imageRegistry/]repository, then @digest when a
digest is set, else :tag. With global.imageRegistry the repository's own
registry is replaced: its first path component is a registry when it has a
"." or a ":" or is "localhost", the rule of the Docker reference grammar
(github.com/distribution/reference, normalize.go, splitDockerDomain).
*/}}
{{- define "mountguard.image" -}}
{{- $repo := .image.repository -}}
{{- with (.ctx.Values.global | default dict).imageRegistry -}}
{{- $parts := splitList "/" $repo -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repo = join "/" (rest $parts) -}}
{{- end -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" .) $repo -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- $tag := .image.tag | default .ctx.Values.image.tag | default .ctx.Chart.AppVersion -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}
{{- end -}}

{{/*
A securityContext: the chart's defaults (a YAML map in .defaults) with the
user's keys (.override) on top; nested maps (capabilities, seccompProfile)
are replaced whole, not merged, so dropping a default is possible.
*/}}
{{- define "mountguard.securityContext" -}}
{{- $out := fromYaml .defaults -}}
{{- range $k, $v := .override -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* Fails the render when both monitor kinds are enabled: every target would be scraped twice. */}}
{{- define "mountguard.validateMonitors" -}}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled -}}
{{- fail "metrics: enable metrics.serviceMonitor or metrics.podMonitor, not both (every target would be scraped twice)" -}}
{{- end -}}
{{- end -}}

{{/* Leader election is on with more than one controller replica. */}}
{{- define "mountguard.leaderElection" -}}
{{- if gt (int .Values.controller.replicas) 1 -}}true{{- else -}}false{{- end -}}
{{- end -}}

{{/* The remediation mode; an unquoted YAML `off` arrives as false. */}}
{{- define "mountguard.remediationMode" -}}
{{- $m := toString .Values.remediation.mode -}}
{{- if eq $m "false" -}}off{{- else -}}{{ $m }}{{- end -}}
{{- end -}}

{{/* The apps/v1 resources workload remediation watches and patches, quoted
and comma separated (a Deployment's pods belong to its ReplicaSets);
empty without remediation or without workload kinds. */}}
{{- define "mountguard.workloadResources" -}}
{{- if ne (include "mountguard.remediationMode" .) "off" -}}
{{- $k := .Values.remediation.workloads.kinds -}}
{{- $out := list -}}
{{- if has "deployment" $k }}{{ $out = append $out "deployments" }}{{ end -}}
{{- if or (has "deployment" $k) (has "replicaset" $k) }}{{ $out = append $out "replicasets" }}{{ end -}}
{{- if has "statefulset" $k }}{{ $out = append $out "statefulsets" }}{{ end -}}
{{- if has "daemonset" $k }}{{ $out = append $out "daemonsets" }}{{ end -}}
{{- range $i, $r := $out }}{{ if $i }}, {{ end }}{{ $r | quote }}{{ end -}}
{{- end -}}
{{- end -}}

{{- define "mountguard.remediationEnabled" -}}
{{- if ne (include "mountguard.remediationMode" .) "off" -}}true{{- else -}}false{{- end -}}
{{- end -}}

{{- define "mountguard.tlsEnabled" -}}
{{- if .Values.tls.insecurePlaintextReports -}}false{{- else -}}true{{- end -}}
{{- end -}}

{{- define "mountguard.monitoringAPI" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}true{{- else -}}false{{- end -}}
{{- end -}}

{{/* The report API's URL as the agents use it. */}}
{{- define "mountguard.controllerURL" -}}
{{- $scheme := ternary "http" "https" .Values.tls.insecurePlaintextReports -}}
{{- printf "%s://%s.%s.svc:%d" $scheme (include "mountguard.controller.fullname" .) .Release.Namespace (int .Values.controller.reportPort) -}}
{{- end -}}

{{/* A duration of the form <n>s, <n>m or <n>h, in seconds. */}}
{{- define "mountguard.seconds" -}}
{{- $d := toString . -}}
{{- if hasSuffix "h" $d -}}{{ mul (atoi (trimSuffix "h" $d)) 3600 }}
{{- else if hasSuffix "m" $d -}}{{ mul (atoi (trimSuffix "m" $d)) 60 }}
{{- else -}}{{ atoi (trimSuffix "s" $d) }}
{{- end -}}
{{- end -}}

{{/*
A size value (values.schema.json $defs/size) as the binaries' flags take it:
a string as written (16Mi), a number as its digits (YAML numbers reach the
templates as floats).
*/}}
{{- define "mountguard.size" -}}
{{- if kindIs "string" . -}}{{ . }}{{- else -}}{{ int64 . }}{{- end -}}
{{- end -}}

{{/* A size value in bytes (the units of inventory/src/size.rs). */}}
{{- define "mountguard.bytes" -}}
{{- $s := include "mountguard.size" . -}}
{{- $n := regexFind "^[0-9]+" $s -}}
{{- $unit := trimPrefix $n $s -}}
{{- $mult := dict "" 1 "B" 1 "Ki" 1024 "KiB" 1024 "Mi" 1048576 "MiB" 1048576 "Gi" 1073741824 "GiB" 1073741824 "K" 1000 "KB" 1000 "M" 1000000 "MB" 1000000 "G" 1000000000 "GB" 1000000000 -}}
{{- mul (atoi $n) (get $mult $unit) -}}
{{- end -}}

{{/* Fails the render on sizes below what the binaries can work with. */}}
{{- define "mountguard.validateSizes" -}}
{{- $s := include "mountguard.size" .Values.controller.maxReportBytes -}}
{{- /* Seven digits or more are a million bytes at least (and could overflow int64 times Gi). */ -}}
{{- if and (le (len (regexFind "^[0-9]+" $s)) 6) (lt (atoi (include "mountguard.bytes" .Values.controller.maxReportBytes)) 1024) -}}
{{- fail (printf "controller.maxReportBytes: %v is below 1024 bytes; a report of one small node does not fit" .Values.controller.maxReportBytes) -}}
{{- end -}}
{{- end -}}

{{/* Fails the render on inconsistent TLS settings. */}}
{{- define "mountguard.validateTLS" -}}
{{- if and (not .Values.tls.insecurePlaintextReports) (not .Values.tls.certManager.enabled) (not .Values.tls.existingSecret) -}}
{{- fail "tls: enable tls.certManager, set tls.existingSecret, or (test clusters only) set tls.insecurePlaintextReports" -}}
{{- end -}}
{{- if and (not .Values.tls.insecurePlaintextReports) .Values.tls.certManager.enabled .Values.tls.existingSecret -}}
{{- fail "tls: set either tls.certManager.enabled or tls.existingSecret, not both" -}}
{{- end -}}
{{- end -}}

{{/* The admission webhook: its Service, Secret and whether it is on. */}}
{{- define "mountguard.admission.fullname" -}}{{ include "mountguard.fullname" . }}-admission{{- end -}}
{{- define "mountguard.admission.enabled" -}}
{{- if ne .Values.admission.mode "off" -}}true{{- else -}}false{{- end -}}
{{- end -}}
{{- define "mountguard.admission.certManager" -}}
{{- if and (eq (include "mountguard.admission.enabled" .) "true") .Values.tls.certManager.enabled (eq (include "mountguard.tlsEnabled" .) "true") -}}true{{- else -}}false{{- end -}}
{{- end -}}
