{{/*
The release's name for its objects: the release name when it holds the chart's name
(`helm install gpushare-bench …` gives the names of manifests/base), else
<release>-gpushare-bench. At most 63 characters.
*/}}
{{- define "gpushare-bench.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* chart-version, for helm.sh/chart. */}}
{{- define "gpushare-bench.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The labels of every object but app.kubernetes.io/name and instance. */}}
{{- define "gpushare-bench.commonLabels" -}}
helm.sh/chart: {{ include "gpushare-bench.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpushare-bench
{{- end -}}

{{/* Standard labels of the chart's own objects. */}}
{{- define "gpushare-bench.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{ include "gpushare-bench.commonLabels" . }}
{{- end -}}

{{/*
Labels of the objects in front of the workload pods the harness makes (Service,
PodMonitor): app.kubernetes.io/name is theirs, gpushare-workload.
*/}}
{{- define "gpushare-bench.workloadLabels" -}}
app.kubernetes.io/name: gpushare-workload
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{ include "gpushare-bench.commonLabels" . }}
{{- end -}}

{{/*
The Job's pod: app.kubernetes.io/name is the harness's (objects.rs HARNESS_APP), which the
NetworkPolicy to Prometheus selects.
*/}}
{{- define "gpushare-bench.harnessSelector" -}}
app.kubernetes.io/name: gpushare-bench-harness
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{/* The GPU node, required. */}}
{{- define "gpushare-bench.node" -}}
{{- required "node is required: the GPU node's name, e.g. --set node=gpu-node-1 (kubectl get nodes -l nvidia.com/gpu.present=true)" .Values.node -}}
{{- end -}}

{{/* registry/repository:tag, or repository:tag without a registry. */}}
{{- define "gpushare-bench.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .Values.image.registry) .Values.image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The claim mounted at /results. */}}
{{- define "gpushare-bench.claim" -}}
{{- .Values.results.persistence.existingClaim | default (printf "%s-results" (include "gpushare-bench.fullname" .)) -}}
{{- end -}}

{{/* The reader Pod's name. */}}
{{- define "gpushare-bench.reader" -}}
{{- printf "%s-results" (include "gpushare-bench.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The pods' security context (the image's user gpushare, uid 10001); fsGroup makes the
claim writable by it.
*/}}
{{- define "gpushare-bench.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpushare-bench.containerSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities:
  drop:
    - ALL
{{- end -}}

{{/*
The harness's command line: the command, the flags the chart owns, then run.args (every
`$` doubled: the kubelet expands $(VAR) in args). A flag of the chart's in run.args fails
here, naming the value that sets it.
*/}}
{{- define "gpushare-bench.args" -}}
{{- $owned := dict "--backend" "it is always kubernetes" "--node" "set the value node" "--namespace" "it is the release namespace (-n)" "--prometheus" "set prometheus.url" "--out" "it is always /results" "--quiet" "it is always given" "-q" "it is always given" "--operator-namespace" "set operatorNamespace" "--sharing-api" "set sharingApi" -}}
{{- $ownImage := false -}}
{{- $flags := list -}}
{{- range .Values.run.args -}}
{{- $flag := regexReplaceAll "=.*$" . "" -}}
{{- $flags = append $flags $flag -}}
{{- if hasKey $owned $flag -}}
{{- fail (printf "run.args: the chart passes %s itself: %s" $flag (get $owned $flag)) -}}
{{- end -}}
{{- if has $flag (list "--image" "--server-image") -}}
{{- $ownImage = true -}}
{{- end -}}
{{- end -}}
{{- if and (eq .Values.run.command "capacity") (not (and (has "--load" $flags) (has "--slo" $flags))) -}}
{{- fail "run.command capacity needs a per-pod load and a latency objective in run.args, e.g. [\"--load\", \"poisson:100\", \"--slo\", \"p99=25ms\"]" -}}
{{- end -}}
{{- $args := list .Values.run.command "--backend" "kubernetes" "--node" (include "gpushare-bench.node" .) "--namespace" .Release.Namespace "--prometheus" .Values.prometheus.url "--out" "/results" "--quiet" "--operator-namespace" .Values.operatorNamespace -}}
{{- if eq .Values.sharingApi "dra" -}}
{{- $args = concat $args (list "--sharing-api" "dra") -}}
{{- end -}}
{{- if not $ownImage -}}
{{- $args = concat $args (list "--image" (include "gpushare-bench.image" .)) -}}
{{- end -}}
{{- range .Values.imagePullSecrets -}}
{{- $args = concat $args (list "--image-pull-secret" .name) -}}
{{- end -}}
{{- range .Values.run.args -}}
{{- $args = append $args (replace "$" "$$" .) -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}
