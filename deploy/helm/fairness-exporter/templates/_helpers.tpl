{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "fairness-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, prefixed to the chart name unless it already contains it. */}}
{{- define "fairness-exporter.fullname" -}}
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

{{- define "fairness-exporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fairness-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fairness-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fairness-exporter.labels" -}}
helm.sh/chart: {{ include "fairness-exporter.chart" . }}
{{ include "fairness-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ include "fairness-exporter.version" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fairness-exporter
{{- end }}

{{/* The version label: image.tag (else appVersion) in the 63 characters of a label value's alphabet; a digest
never reaches it (image.digest pins the image, the tag stays the readable version). */}}
{{- define "fairness-exporter.version" -}}
{{- regexReplaceAll "[^A-Za-z0-9_.-]" (.Values.image.tag | default .Chart.AppVersion) "_" | trunc 63 | trimAll "_.-" }}
{{- end }}

{{/* The daemon's pods, not the audit CronJob's (app.kubernetes.io/component: audit), for the NetworkPolicy and
the PodDisruptionBudget. */}}
{{- define "fairness-exporter.daemonPodSelector" -}}
matchLabels:
  {{- include "fairness-exporter.selectorLabels" . | nindent 2 }}
matchExpressions:
  - {key: app.kubernetes.io/component, operator: DoesNotExist}
{{- end }}

{{- define "fairness-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fairness-exporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The port the daemon listens on: config.listen.port, which is also the container port. */}}
{{- define "fairness-exporter.port" -}}
{{- dig "listen" "port" 9108 .Values.config | int }}
{{- end }}

{{/* HTTPS when the daemon serves TLS (config.listen.tls_cert_file), for the probes and the ServiceMonitor. */}}
{{- define "fairness-exporter.scheme" -}}
{{- if or (dig "listen" "tls_cert_file" "" .Values.config) (and .Values.webConfig.secretName .Values.webConfig.tls) }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/*
The daemon's config file: .Values.config, with `checkpoint` set from the top-level `checkpoint` block so that the
path in the config and the volume's mount path cannot disagree.
*/}}
{{- define "fairness-exporter.config" -}}
{{- $config := deepCopy .Values.config }}
{{- $fleet := or $config.models .Values.modelConfigMaps.enabled }}
{{- if $fleet }}
{{- if or $config.model_id $config.protected_attributes }}
{{- fail "config.model_id and config.protected_attributes configure one model: with config.models or modelConfigMaps, each model names its own (leave them empty)" }}
{{- end }}
{{- $_ := unset $config "model_id" }}
{{- $_ := unset $config "protected_attributes" }}
{{- if not $config.models }}{{ $_ := unset $config "models" }}{{ end }}
{{- if .Values.modelConfigMaps.enabled }}
{{- $_ := set $config "models_dir" .Values.modelConfigMaps.folder }}
{{- end }}
{{- else }}
{{- $_ := required "config.model_id is required (one model), or config.models or modelConfigMaps.enabled (a fleet): the models whose prediction events this daemon counts" $config.model_id }}
{{- if not $config.protected_attributes }}
{{- fail "config.protected_attributes is required: at least one {name, groups} entry (docs/contract.md)" }}
{{- end }}
{{- $_ := unset $config "models" }}
{{- end }}
{{- if hasKey $config "checkpoint" }}
{{- fail "config.checkpoint is set by the chart: use checkpoint.enabled, checkpoint.path and checkpoint.interval instead" }}
{{- end }}
{{- $kafka := deepCopy (default (dict) $config.kafka) }}
{{- $staged := eq (include "fairness-exporter.stages" .) "staged" }}
{{- /* docs/sre/scale-out.md: a second direct, subscribed member of the group refuses to start (exit 2): such a
release could never be whole. Manual assignment has every replica read every partition: each is whole. */}}
{{- if and (not $staged) (gt (int .Values.replicaCount) 1) (eq (dig "assignment" "subscribe" $kafka) "subscribe") }}
{{- fail (printf "replicaCount is %d with config.kafka.stages: direct and config.kafka.assignment: subscribe: every replica after the first would refuse to start (a direct replica counts what it reads, so each model would be split between them; docs/sre/scale-out.md). Set config.kafka.stages: staged (or leave it unset: the chart sets it above one replica), replicaCount: 1, or config.kafka.assignment: manual (each replica reads every partition, their series duplicates)" (int .Values.replicaCount)) }}
{{- end }}
{{- $_ := set $kafka "stages" (include "fairness-exporter.stages" .) }}
{{- if $staged }}
{{- if .Values.checkpoint.enabled }}
{{- fail "checkpoint.enabled keeps one replica's state on a volume (kafka.stages: direct); with kafka.stages: staged (replicaCount > 1) the state lives in the internal topics: disable it (checkpoint.interval still sets how often it is snapshotted)" }}
{{- end }}
{{- $_ := set $config "checkpoint" (dict "interval" .Values.checkpoint.interval) }}
{{- $topics := dict }}
{{- range $key, $topic := .Values.internalTopics }}
{{- $t := dict "partitions" (int $topic.partitions) }}
{{- with $topic.name }}{{ $_ := set $t "name" . }}{{ end }}
{{- with $topic.retention }}{{ $_ := set $t "retention" . }}{{ end }}
{{- $_ := set $topics $key $t }}
{{- end }}
{{- $_ := set $kafka "internal_topics" $topics }}
{{- else if .Values.checkpoint.enabled }}
{{- $_ := set $config "checkpoint" (dict "path" .Values.checkpoint.path "interval" .Values.checkpoint.interval) }}
{{- end }}
{{- if eq (include "fairness-exporter.staticMember" .) "true" }}
{{- $client := deepCopy (default (dict) $kafka.client) }}
{{- $key := ternary "group.instance.id" "group_instance_id" (eq (dig "client_library" "kafka-python" $kafka) "confluent-kafka") }}
{{- $_ := set $client $key "${FAIRNESS_EXPORTER_POD_NAME}" }}
{{- $_ := set $kafka "client" $client }}
{{- end }}
{{- $_ := set $config "kafka" $kafka }}
{{- toYaml $config }}
{{- end }}

{{/* kafka.stages: as config.kafka.stages says, else staged above one replica (each model whole on one replica),
direct at one (measurably faster: no event is written and read a second time). */}}
{{- define "fairness-exporter.stages" -}}
{{- dig "kafka" "stages" (ternary "staged" "direct" (gt (int .Values.replicaCount) 1)) .Values.config }}
{{- end }}

{{/* "true" when the consumer is a static member of its group named by the pod (staticMembership): one direct,
subscribed replica, whose config sets no instance id of its own. */}}
{{- define "fairness-exporter.staticMember" -}}
{{- $kafka := default (dict) .Values.config.kafka }}
{{- $client := default (dict) $kafka.client }}
{{- $own := or (hasKey $client "group_instance_id") (hasKey $client "group.instance.id") }}
{{- and .Values.staticMembership (eq (include "fairness-exporter.stages" .) "direct") (eq (dig "assignment" "subscribe" $kafka) "subscribe") (not $own) }}
{{- end }}

{{/* A container's environment (`.root` the chart, `.extra` more entries): the pod's name when the config names
the consumer's static member by it (the daemon's config is the audit job's too, and every ${NAME} in it must be
set), then `env`, then `.extra`. */}}
{{- define "fairness-exporter.env" -}}
{{- if eq (include "fairness-exporter.staticMember" .root) "true" }}
- name: FAIRNESS_EXPORTER_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
{{- with concat .root.Values.env .extra }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The pod template shared by the Deployment and the StatefulSet. */}}
{{- define "fairness-exporter.podTemplate" -}}
metadata:
  annotations:
    checksum/config: {{ include "fairness-exporter.config" . | sha256sum }}
    kubectl.kubernetes.io/default-container: fairness-exporter
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  labels:
    {{- include "fairness-exporter.labels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "fairness-exporter.serviceAccountName" . }}
  automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- if .Values.modelConfigMaps.enabled }}
  initContainers:
    {{- include "fairness-exporter.modelsSidecar" (dict "root" . "method" "LIST") | nindent 4 }}
  {{- end }}
  containers:
    # the daemon first: `kubectl logs` and `kubectl exec` land in it (and the default-container annotation says so)
    - name: fairness-exporter
      {{- include "fairness-exporter.daemonImage" . | nindent 6 }}
      args: ["serve", "--config", "/etc/fairness-exporter/config.yaml"
             {{- with .Values.webConfig.secretName }}, "--web.config.file", "/etc/fairness-exporter/web/{{ $.Values.webConfig.key }}"{{ end }}]
      ports:
        - name: metrics
          containerPort: {{ include "fairness-exporter.port" . }}
          protocol: TCP
      {{- with include "fairness-exporter.env" (dict "root" . "extra" list) }}
      env:
        {{- . | nindent 8 }}
      {{- end }}
      {{- with .Values.envFrom }}
      envFrom:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      # /healthz answers once the port is bound, after the checkpoint is restored and any estimation reference read:
      # until then the startup probe holds the liveness probe off, however long that takes within its budget
      startupProbe:
        httpGet:
          path: /healthz
          port: metrics
          scheme: {{ include "fairness-exporter.scheme" . }}
        {{- toYaml .Values.startupProbe | nindent 8 }}
      livenessProbe:
        httpGet:
          path: /healthz
          port: metrics
          scheme: {{ include "fairness-exporter.scheme" . }}
        {{- toYaml .Values.livenessProbe | nindent 8 }}
      readinessProbe:
        httpGet:
          path: /readyz
          port: metrics
          scheme: {{ include "fairness-exporter.scheme" . }}
        {{- toYaml .Values.readinessProbe | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: config
          mountPath: /etc/fairness-exporter
          readOnly: true
        - name: tmp
          mountPath: /tmp
        {{- if .Values.webConfig.secretName }}
        - name: web-config
          mountPath: /etc/fairness-exporter/web
          readOnly: true
        {{- end }}
        {{- if .Values.checkpoint.enabled }}
        - name: checkpoint
          mountPath: {{ .Values.checkpoint.path }}
        {{- end }}
        {{- if .Values.modelConfigMaps.enabled }}
        - name: models
          mountPath: {{ .Values.modelConfigMaps.folder }}
          readOnly: true
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    {{- if .Values.modelConfigMaps.enabled }}
    {{- include "fairness-exporter.modelsSidecar" (dict "root" . "method" "WATCH") | nindent 4 }}
    {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "fairness-exporter.fullname" . }}
    - name: tmp
      emptyDir: {}
    {{- with .Values.webConfig.secretName }}
    - name: web-config
      secret:
        secretName: {{ . }}
    {{- end }}
    {{- if .Values.modelConfigMaps.enabled }}
    - name: models
      emptyDir: {}
    - name: sidecar-token  # what automountServiceAccountToken would mount, for the sidecar's container only
      projected:
        sources:
          - serviceAccountToken: {path: token, expirationSeconds: 3607}
          - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
          - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* The k8s-sidecar that copies the labelled model ConfigMaps into models_dir: once before the daemon starts
(method LIST, as an init container), then watching for changes (WATCH). */}}
{{- define "fairness-exporter.modelsSidecar" -}}
{{- $values := .root.Values.modelConfigMaps }}
- name: {{ if eq .method "LIST" }}models-init{{ else }}models{{ end }}
  image: {{ include "fairness-exporter.imageRef" (dict "image" $values.image "tag" "" "field" "modelConfigMaps.image") | quote }}
  imagePullPolicy: {{ $values.image.pullPolicy }}
  env:
    - {name: LABEL, value: {{ $values.label | quote }}}
    {{- with $values.labelValue }}
    - {name: LABEL_VALUE, value: {{ . | quote }}}
    {{- end }}
    - {name: FOLDER, value: {{ $values.folder | quote }}}
    - {name: RESOURCE, value: configmap}
    - {name: METHOD, value: {{ .method }}}
    {{- with $values.namespace }}
    - {name: NAMESPACE, value: {{ . | quote }}}
    {{- end }}
  securityContext:
    {{- toYaml .root.Values.securityContext | nindent 4 }}
  {{- with $values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - {name: models, mountPath: {{ $values.folder }}}
    - {name: sidecar-token, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}
{{- end }}

{{/*
The canary gate's PromQL for the model id `.model` serving a version matching `.version` (both placeholders of the
rollout tool: Argo Rollouts' {{args.x}}, Flagger's {{ variables.x }}). Its value: the model's pair detectors in
alarm (what pages) plus its comparisons of a blocking metric whose evidence is fail, over every window (0 passes).
No value (a check that evaluated nothing never passes) while a blocking comparison has no value in any window, or
when the daemon does not monitor that model id at that version; a failure is reported as soon as there is one.
*/}}
{{- define "fairness-exporter.canaryQuery" -}}
{{- $id := printf "model_id=\"%s\"" .model }}
{{- $blocking := printf "fairness_threshold{%s, severity=\"blocking\"}" $id }}
{{- $signals := printf "sum(fairness_detector_alarm{%s})\n    + sum(model_comparison_evidence{%s, evidence=\"fail\"} and on(model_id, metric) %s)" $id $id $blocking -}}
(
  (
    {{ $signals }}
  ) > 0
  or
  (
    {{ $signals }}
  )
  unless on() (
    min by (attribute, dimension, metric) (model_comparison_insufficient_samples{ {{- $id -}} }) == 1
    and on(metric) {{ $blocking }}
  )
)
and on() fairness_model_info{ {{- $id }}, model_version=~"{{ .version }}"}
{{- end }}
