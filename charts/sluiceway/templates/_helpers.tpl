{{/* The controller image: repository@digest when a digest is set, else repository:tag. */}}
{{- define "sluiceway.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* Labels on every object; pass (dict "root" $ "component" "operator"). */}}
{{- define "sluiceway.labels" -}}
app.kubernetes.io/name: {{ include "sluiceway.name" .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: sluiceway
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The app.kubernetes.io/name of a component's objects. */}}
{{- define "sluiceway.name" -}}
sluiceway-{{ . }}
{{- end }}

{{/* Selector labels of a component's pods (the object names are fixed: one release per cluster). */}}
{{- define "sluiceway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluiceway.name" . }}
{{- end }}

{{/* Namespaces the inference pods live in: the explicit list, else operator.namespaces. */}}
{{- define "sluiceway.inferenceNamespaces" -}}
{{- $ns := .explicit | default .root.Values.operator.namespaces -}}
{{- toJson $ns -}}
{{- end }}

{{/* Scheduling keys shared by both Deployments: pass the component's values. */}}
{{- define "sluiceway.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{/* The release's full name: the release name when it contains the chart's name, else
release-chart (63 characters at most). Names the Secrets the chart generates per release. */}}
{{- define "sluiceway.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}
{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}
{{- end }}

{{/* The quota key Secret (key `key`), mounted read-only in the operator and the scaler. */}}
{{- define "sluiceway.quotaKeySecret" -}}
{{ include "sluiceway.fullname" . | trunc 53 | trimSuffix "-" }}-quota-key
{{- end }}

{{/* Where the quota key is mounted (directory) in the operator and the scaler. */}}
{{- define "sluiceway.quotaKeyDir" -}}
/etc/sluiceway/quota-key
{{- end }}

{{/* Whether tenant quotas are on (the coordinator runs in the scaler). */}}
{{- define "sluiceway.quotaOn" -}}
{{- if and .Values.scaler.enabled .Values.scaler.quota.enabled -}}true{{- end -}}
{{- end }}

{{/* The scaler's TLS Secret (tls.crt, tls.key, ca.crt): the user's, or the one the chart generates. */}}
{{- define "sluiceway.scalerTlsSecret" -}}
{{ .Values.scaler.tls.secretName | default "sluiceway-scaler-tls" }}
{{- end }}

{{/* KEDA's client certificate Secret (in scaler.tls.kedaNamespace): the user's, or the generated one. */}}
{{- define "sluiceway.kedaClientSecret" -}}
{{ .Values.scaler.tls.kedaClientSecret | default "sluiceway-keda-client" }}
{{- end }}

{{/*
A policy list as the operator's env value (comma-separated): the value when the key is set (an empty
list stays empty: it allows nothing), else the chart's default. `helm upgrade --reuse-values` from a
chart version without operator.policy renders with the old values.yaml: the defaults then come from
here. Call with (list $policy "key" (list default...)).
*/}}
{{- define "sluiceway.policyValue" -}}
{{- $p := index . 0 }}
{{- $key := index . 1 }}
{{- if hasKey $p $key }}{{ join "," (index $p $key) }}{{ else }}{{ join "," (index . 2) }}{{ end }}
{{- end }}

{{/*
Prometheus credentials (prometheusAuth): the file of sluiceway_core.promauth that the scaler reads
(--prometheus-auth-file) and the operator reads (SLUICEWAY_PROMETHEUS_AUTH_FILE), rendered into the
ConfigMap sluiceway-prometheus-auth. It holds only paths: each Secret it names is mounted read-only
at <promAuthDir>/secrets/<secretName> in both pods. Empty output: no credentials configured.
*/}}
{{- define "sluiceway.promAuthDir" -}}
/etc/sluiceway/prometheus-auth
{{- end }}

{{- define "sluiceway.promAuthFile" -}}
{{ include "sluiceway.promAuthDir" . }}/config/auth.json
{{- end }}

{{- define "sluiceway.promAuthDoc" -}}
{{- $root := printf "%s/secrets" (include "sluiceway.promAuthDir" .) }}
{{- $entries := list }}
{{- range $i, $a := (.Values.prometheusAuth | default list) }}
{{- $e := dict "url" $a.url }}
{{- with $a.bearerToken }}
{{- $_ := set $e "bearerTokenFile" (printf "%s/%s/%s" $root .secretName (.key | default "token")) }}
{{- end }}
{{- with $a.basicAuth }}
{{- $b := dict "passwordFile" (printf "%s/%s/%s" $root .secretName (.passwordKey | default "password")) }}
{{- if .usernameKey }}
{{- $_ := set $b "usernameFile" (printf "%s/%s/%s" $root .secretName .usernameKey) }}
{{- else if .username }}
{{- $_ := set $b "username" .username }}
{{- else }}
{{- fail (printf "prometheusAuth[%d].basicAuth: set username, or usernameKey (a key of Secret %s)" $i .secretName) }}
{{- end }}
{{- $_ := set $e "basicAuth" $b }}
{{- end }}
{{- with $a.tls }}
{{- $t := dict }}
{{- if .caKey }}
{{- $_ := set $t "caFile" (printf "%s/%s/%s" $root .secretName .caKey) }}
{{- end }}
{{- if .certKey }}
{{- $_ := set $t "certFile" (printf "%s/%s/%s" $root .secretName .certKey) }}
{{- $_ := set $t "keyFile" (printf "%s/%s/%s" $root .secretName (.keyKey | default "tls.key")) }}
{{- end }}
{{- $_ := set $e "tls" $t }}
{{- end }}
{{- with $a.headers }}
{{- $_ := set $e "headers" . }}
{{- end }}
{{- $entries = append $entries $e }}
{{- end }}
{{- if $entries }}{{ dict "prometheus" $entries | toJson }}{{ end }}
{{- end }}

{{/* The Secrets prometheusAuth names, once each (JSON list). */}}
{{- define "sluiceway.promAuthSecrets" -}}
{{- $names := list }}
{{- range (.Values.prometheusAuth | default list) }}
{{- with .bearerToken }}{{ $names = append $names .secretName }}{{ end }}
{{- with .basicAuth }}{{ $names = append $names .secretName }}{{ end }}
{{- with .tls }}{{ $names = append $names .secretName }}{{ end }}
{{- end }}
{{- $names | uniq | toJson }}
{{- end }}

{{/* volumeMounts of the Prometheus credentials (the same in the operator and the scaler). */}}
{{- define "sluiceway.promAuthMounts" -}}
{{- if include "sluiceway.promAuthDoc" . }}
- {name: prom-auth-config, mountPath: {{ include "sluiceway.promAuthDir" . }}/config, readOnly: true}
{{- range $i, $name := include "sluiceway.promAuthSecrets" . | fromJsonArray }}
- {name: prom-auth-{{ $i }}, mountPath: {{ include "sluiceway.promAuthDir" $ }}/secrets/{{ $name }}, readOnly: true}
{{- end }}
{{- end }}
{{- end }}

{{/* volumes of the Prometheus credentials. */}}
{{- define "sluiceway.promAuthVolumes" -}}
{{- if include "sluiceway.promAuthDoc" . }}
- name: prom-auth-config
  configMap:
    name: sluiceway-prometheus-auth
{{- range $i, $name := include "sluiceway.promAuthSecrets" . | fromJsonArray }}
- name: prom-auth-{{ $i }}
  secret:
    secretName: {{ $name }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod annotations: the values' plus a hash of the credentials file, so a change rolls the pods. */}}
{{- define "sluiceway.podAnnotations" -}}
{{- $ann := deepCopy (.annotations | default dict) }}
{{- with include "sluiceway.promAuthDoc" .root }}
{{- $_ := set $ann "sluiceway.io/prometheus-auth" (sha256sum . | trunc 16) }}
{{- end }}
{{- with $ann }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
