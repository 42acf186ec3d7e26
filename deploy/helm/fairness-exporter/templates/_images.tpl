{{/* The images the chart runs: the daemon image, the full image, and which one the daemon's pods run. */}}

{{/*
An image reference from {repository, tag, digest} (`.image`), the tag defaulting to `.tag`: repository@digest
when a digest is set (what the kubelet pulls is then fixed), else repository:tag. `.field` names the values key
in the one-line error for a malformed digest or a digest written into the tag.
*/}}
{{- define "fairness-exporter.imageRef" -}}
{{- $image := .image }}
{{- if contains "@" (toString $image.tag) }}
{{- fail (printf "%s.tag %q holds a digest: put it in %s.digest (sha256:<64 hex digits>) and keep the tag a version, which the app.kubernetes.io/version label shows" .field $image.tag .field) }}
{{- end }}
{{- with $image.digest }}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .) }}
{{- fail (printf "%s.digest %q is not a digest: expected sha256:<64 lowercase hex digits>, as `docker buildx imagetools inspect` or `crane digest` print it" $.field .) }}
{{- end }}
{{- printf "%s@%s" $image.repository . }}
{{- else }}
{{- printf "%s:%s" $image.repository ($image.tag | default .tag) }}
{{- end }}
{{- end }}

{{/* The daemon image (the Dockerfile's `daemon` target). */}}
{{- define "fairness-exporter.image" -}}
{{- include "fairness-exporter.imageRef" (dict "image" .Values.image "tag" .Chart.AppVersion "field" "image") }}
{{- end }}

{{/* The full image (the Dockerfile's `full` target: the gate, reports and object storage), the audit CronJob's
and, when a model estimates, the daemon's (fairness-exporter.target): the daemon image's repository and version
with the -full suffix unless auditCronJob.image sets them. */}}
{{- define "fairness-exporter.fullImage" -}}
{{- $image := deepCopy .Values.auditCronJob.image }}
{{- $_ := set $image "repository" ($image.repository | default .Values.image.repository) }}
{{- $tag := printf "%s-full" (.Values.image.tag | default .Chart.AppVersion) }}
{{- include "fairness-exporter.imageRef" (dict "image" $image "tag" $tag "field" "auditCronJob.image") }}
{{- end }}

{{/* "true" when a model of the chart's config has `estimation:` (config.estimation, every fleet model's default,
or an entry of config.models): the daemon reads its reference at start and on a reload with the gate's reader
(pandas, pyarrow: docs/auditor/estimated.md), which the daemon image leaves out. The models of modelConfigMaps
are not seen here: image.target says. */}}
{{- define "fairness-exporter.estimates" -}}
{{- $found := not (empty .Values.config.estimation) }}
{{- range .Values.config.models }}{{ if .estimation }}{{ $found = true }}{{ end }}{{ end }}
{{- $found }}
{{- end }}

{{/* The image the daemon's pods run, image.target: "daemon" or "full"; empty: full when a model estimates. A model
with estimation: in the daemon image exits 2 at start, so asking for that is refused here. */}}
{{- define "fairness-exporter.target" -}}
{{- $estimates := eq (include "fairness-exporter.estimates" .) "true" }}
{{- $target := .Values.image.target | default (ternary "full" "daemon" $estimates) }}
{{- if not (has $target (list "daemon" "full")) }}
{{- fail (printf "image.target %q: expected daemon, full, or empty (full when a model of config has estimation:, else daemon)" $target) }}
{{- end }}
{{- if and $estimates (eq $target "daemon") }}
{{- fail "image.target is daemon, but a model of config has estimation:, whose reference only the full image can read (pandas, pyarrow; docs/auditor/estimated.md): the daemon would exit 2 at start. Set image.target: full, or leave it empty (full then)" }}
{{- end }}
{{- $target }}
{{- end }}

{{/* The daemon's container image and pull policy, of the image fairness-exporter.target names. */}}
{{- define "fairness-exporter.daemonImage" -}}
{{- if eq (include "fairness-exporter.target" .) "full" -}}
image: {{ include "fairness-exporter.fullImage" . | quote }}
imagePullPolicy: {{ .Values.auditCronJob.image.pullPolicy | default .Values.image.pullPolicy }}
{{- else -}}
image: {{ include "fairness-exporter.image" . | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- end }}
{{- end }}
