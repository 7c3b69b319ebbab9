{{/* Names ------------------------------------------------------------ */}}
{{- define "kmq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kmq.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kmq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels; call with (dict "ctx" $ "component" "tracker") */}}
{{- define "kmq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kmq.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kmq.labels" -}}
helm.sh/chart: {{ include "kmq.chart" .ctx }}
{{ include "kmq.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: kmq
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end -}}

{{- define "kmq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kmq.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository@digest when a digest is set (what was tested is what runs), else repository:tag. */}}
{{- define "kmq.imageRef" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository (default .appVersion .tag) -}}
{{- end -}}
{{- end -}}

{{- define "kmq.image" -}}
{{- include "kmq.imageRef" (merge (dict "appVersion" .Chart.AppVersion) .Values.image) -}}
{{- end -}}

{{- define "kmq.sparkImage" -}}
{{- include "kmq.imageRef" (merge (dict "appVersion" .Chart.AppVersion) .Values.sparkImage) -}}
{{- end -}}

{{/* A kmq duration (250ms, 30s, 5m, 1h, 7d or a number of seconds; spaces allowed around the
     number and the unit, as kmq reads it: kmq.config DURATION_PATTERN) in seconds. */}}
{{- /* The prefix of a queues[] entry's topics and its metrics' queue label: the queue's name for the
default group (group unset or "default"), <name>__<group> for a named consumer group (docs/protocol.md). */ -}}
{{- define "kmq.queuePrefix" -}}
{{- if and .group (ne .group "default") -}}{{ printf "%s__%s" .name .group }}{{- else -}}{{ .name }}{{- end -}}
{{- end -}}

{{- define "kmq.seconds" -}}
{{- $v := toString . | trim -}}
{{- if hasSuffix "ms" $v -}}{{ divf (trimSuffix "ms" $v | trim | float64) 1000 }}
{{- else if hasSuffix "s" $v -}}{{ trimSuffix "s" $v | trim | float64 }}
{{- else if hasSuffix "m" $v -}}{{ mulf (trimSuffix "m" $v | trim | float64) 60 }}
{{- else if hasSuffix "h" $v -}}{{ mulf (trimSuffix "h" $v | trim | float64) 3600 }}
{{- else if hasSuffix "d" $v -}}{{ mulf (trimSuffix "d" $v | trim | float64) 86400 }}
{{- else -}}{{ $v | float64 }}
{{- end -}}
{{- end -}}

{{/* Checks across values that values.schema.json cannot express. */}}
{{- define "kmq.validate" -}}
{{- $k := .Values.kafka -}}
{{- if and (hasPrefix "SASL" $k.securityProtocol) (not $k.saslMechanism) -}}
{{- fail (printf "kafka.saslMechanism is required when kafka.securityProtocol is %s" $k.securityProtocol) -}}
{{- end -}}
{{- if and $k.saslMechanism (not (hasPrefix "SASL" $k.securityProtocol)) -}}
{{- fail (printf "kafka.saslMechanism is set but kafka.securityProtocol is %s; use SASL_SSL or SASL_PLAINTEXT" $k.securityProtocol) -}}
{{- end -}}
{{- if and (has $k.saslMechanism (list "PLAIN" "SCRAM-SHA-256" "SCRAM-SHA-512")) (not $k.existingSecret) -}}
{{- fail "kafka.existingSecret is required with SASL: the password is read from that Secret, never from values" -}}
{{- end -}}
{{- if and (eq $k.saslMechanism "AWS_MSK_IAM") (eq $k.client "confluent") -}}
{{- fail "kafka.client confluent has no AWS_MSK_IAM signer: set kafka.client: kafka-python with saslMechanism AWS_MSK_IAM (or use OAUTHBEARER with an MSK token command)" -}}
{{- end -}}
{{- if and .Values.otel.enabled (not .Values.otel.endpoint) -}}
{{- fail "otel.endpoint is required with otel.enabled: the OTLP/HTTP base URL of your collector, e.g. http://otel-collector.observability:4318" -}}
{{- end -}}
{{- if and $k.tls.clientSecret (not (has $k.securityProtocol (list "SSL" "SASL_SSL"))) -}}
{{- fail (printf "kafka.tls.clientSecret needs kafka.securityProtocol SSL or SASL_SSL, not %s" $k.securityProtocol) -}}
{{- end -}}
{{- if and .Values.hpa.enabled (gt (int .Values.hpa.minReplicas) (int .Values.hpa.maxReplicas)) -}}
{{- fail (printf "hpa.minReplicas (%d) is above hpa.maxReplicas (%d)" (int .Values.hpa.minReplicas) (int .Values.hpa.maxReplicas)) -}}
{{- end -}}
{{- if and .Values.pdb.enabled (not .Values.hpa.enabled) (kindIs "float64" .Values.pdb.minAvailable) (ge (int .Values.pdb.minAvailable) (int .Values.tracker.replicas)) -}}
{{- fail (printf "pdb.minAvailable (%d) must be below tracker.replicas (%d), or node drains block forever" (int .Values.pdb.minAvailable) (int .Values.tracker.replicas)) -}}
{{- end -}}
{{- if regexMatch "^rediss?://[^/@]*@" (.Values.redis.url | default "") -}}
{{- fail "redis.url carries credentials and would land in a ConfigMap: put the URL in a Secret and set redis.existingSecret" -}}
{{- end -}}
{{- if and .Values.redis.url .Values.redis.existingSecret -}}
{{- fail "set either redis.url or redis.existingSecret, not both" -}}
{{- end -}}
{{- if and .Values.topicInit.enabled (eq .Values.topicInit.mode "strimzi") (not .Values.topicInit.strimzi.clusterName) -}}
{{- fail "topicInit.strimzi.clusterName is required with topicInit.mode strimzi (the strimzi.io/cluster label of the KafkaTopic resources)" -}}
{{- end -}}
{{- $rf := .Values.topicInit.replicationFactor -}}
{{- if and $rf .Values.topicInit.minInsyncReplicas (gt (int .Values.topicInit.minInsyncReplicas) (int $rf)) -}}
{{- fail (printf "topicInit.minInsyncReplicas (%d) must not exceed topicInit.replicationFactor (%d), or no write can succeed" (int .Values.topicInit.minInsyncReplicas) (int $rf)) -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $i, $q := .Values.queues -}}
{{- $id := include "kmq.queuePrefix" $q -}}
{{- if hasKey $seen $id -}}
{{- fail (printf "queues[%d].name: queue %q (group %q) is configured twice" $i $q.name ($q.group | default "default")) -}}
{{- end -}}
{{- $_ := set $seen $id true -}}
{{- end -}}
{{- end -}}

{{/* kmq.yaml (docs/configuration.md), generated from values. No secrets. */}}
{{- define "kmq.config" -}}
{{- $k := .Values.kafka -}}
{{- $kafka := dict "bootstrap_servers" $k.bootstrapServers "security_protocol" $k.securityProtocol "client_id" $k.clientId -}}
{{- with $k.saslMechanism }}{{ $_ := set $kafka "sasl_mechanism" . }}{{ end -}}
{{- if and $k.saslUsername (not $k.existingSecretKeys.username) }}{{ $_ := set $kafka "sasl_username" $k.saslUsername }}{{ end -}}
{{- if $k.existingSecret }}{{ $_ := set $kafka "sasl_password_file" (printf "/var/run/secrets/kmq/kafka-credentials/%s" $k.existingSecretKeys.password) }}{{ end -}}
{{- if $k.tls.caSecret }}{{ $_ := set $kafka "ssl_cafile" (printf "/var/run/secrets/kmq/kafka-ca/%s" $k.tls.caKey) }}{{ end -}}
{{- if $k.tls.clientSecret }}{{ $_ := set $kafka "ssl_certfile" (printf "/var/run/secrets/kmq/kafka-client/%s" $k.tls.clientCertKey) }}{{ $_ := set $kafka "ssl_keyfile" (printf "/var/run/secrets/kmq/kafka-client/%s" $k.tls.clientKeyKey) }}{{ end -}}
{{- if and (eq (toString $k.tls.checkHostname) "false") (has $k.securityProtocol (list "SSL" "SASL_SSL")) }}{{ $_ := set $kafka "ssl_check_hostname" false }}{{ end -}}
{{- $queues := list -}}
{{- range .Values.queues }}{{ $queues = append $queues (omit . "partitions") }}{{ end -}}
{{- $tracker := dict "group_id" .Values.tracker.groupId "tick" .Values.tracker.tick "http_port" .Values.tracker.httpPort -}}
{{- if .Values.tracker.livenessTimeout }}{{ $_ := set $tracker "liveness_timeout" .Values.tracker.livenessTimeout }}{{ end -}}
{{- if .Values.tracker.fetchWait }}{{ $_ := set $tracker "fetch_wait" .Values.tracker.fetchWait }}{{ end -}}
{{- $ti := .Values.topicInit -}}
{{- $topics := dict "markers_retention" $ti.markersRetention -}}
{{- with $ti.replicationFactor }}{{ $_ := set $topics "replication_factor" . }}{{ end -}}
{{- with $ti.minInsyncReplicas }}{{ $_ := set $topics "min_insync_replicas" . }}{{ end -}}
{{- with $ti.dlqRetention }}{{ $_ := set $topics "dlq_retention" . }}{{ end -}}
{{- $logging := dict "level" .Values.logging.level "format" .Values.logging.format -}}
{{- $cfg := dict "kafka" $kafka "queues" $queues "tracker" $tracker "topics" $topics "logging" $logging -}}
{{- with .Values.redis.url }}{{ $_ := set $cfg "redis" (dict "url" .) }}{{ end -}}
{{- $cfg = mergeOverwrite $cfg (deepCopy .Values.extraConfig) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Environment of every kmq container (credentials from the existing Secret). kafka.client goes here,
     not into kmq.yaml: the environment beats the image's own KMQ_KAFKA__CLIENT, and workers that
     mount the ConfigMap keep theirs. */}}
{{- define "kmq.env" -}}
- name: KMQ_KAFKA__CLIENT
  value: {{ .Values.kafka.client | quote }}
{{- if and .Values.kafka.existingSecret .Values.kafka.existingSecretKeys.username }}
- name: KMQ_KAFKA__SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.existingSecret }}
      key: {{ .Values.kafka.existingSecretKeys.username }}
{{- end }}
{{- with .Values.redis.existingSecret }}
- name: KMQ_REDIS__URL
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.redis.existingSecretKey }}
{{- end }}
- name: HOME
  value: /tmp
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* OpenTelemetry of the tracker (otel.*): the standard OTEL_* variables kmq tracker run sets its SDK up
     from (kmq.telemetry.otel_sdk); the pod and namespace name its spans' resource. */}}
{{- define "kmq.otelEnv" -}}
{{- if .Values.otel.enabled }}
- name: OTEL_TRACES_EXPORTER
  value: otlp
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: http/protobuf
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otel.endpoint | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ .Values.otel.serviceName | quote }}
- name: K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.pod.name=$(K8S_POD_NAME),k8s.namespace.name={{ .Release.Namespace }}"
{{- end }}
{{- end -}}

{{/* The port of otel.endpoint (for the NetworkPolicy): explicit, else the scheme's. */}}
{{- define "kmq.otelPort" -}}
{{- $u := urlParse .Values.otel.endpoint -}}
{{- if contains ":" $u.host -}}{{ last (splitList ":" $u.host) }}{{- else if eq $u.scheme "https" -}}443{{- else -}}80{{- end -}}
{{- end -}}

{{/* Volumes and mounts: kmq.yaml from a ConfigMap (name in .configMap), credentials, CA, /tmp (.tmpSize, default 64Mi). */}}
{{- define "kmq.volumes" -}}
- name: config
  configMap:
    name: {{ .configMap }}
{{- with .ctx.Values.kafka.existingSecret }}
- name: kafka-credentials
  secret:
    secretName: {{ . }}
    items:
      - key: {{ $.ctx.Values.kafka.existingSecretKeys.password }}
        path: {{ $.ctx.Values.kafka.existingSecretKeys.password }}
{{- end }}
{{- with .ctx.Values.kafka.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ . }}
    items:
      - key: {{ $.ctx.Values.kafka.tls.caKey }}
        path: {{ $.ctx.Values.kafka.tls.caKey }}
{{- end }}
{{- with .ctx.Values.kafka.tls.clientSecret }}
- name: kafka-client
  secret:
    secretName: {{ . }}
    items:
      - key: {{ $.ctx.Values.kafka.tls.clientCertKey }}
        path: {{ $.ctx.Values.kafka.tls.clientCertKey }}
      - key: {{ $.ctx.Values.kafka.tls.clientKeyKey }}
        path: {{ $.ctx.Values.kafka.tls.clientKeyKey }}
{{- end }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .tmpSize | default "64Mi" }}
{{- with .ctx.Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "kmq.volumeMounts" -}}
- name: config
  mountPath: /etc/kmq
  readOnly: true
{{- if .Values.kafka.existingSecret }}
- name: kafka-credentials
  mountPath: /var/run/secrets/kmq/kafka-credentials
  readOnly: true
{{- end }}
{{- if .Values.kafka.tls.caSecret }}
- name: kafka-ca
  mountPath: /var/run/secrets/kmq/kafka-ca
  readOnly: true
{{- end }}
{{- if .Values.kafka.tls.clientSecret }}
- name: kafka-client
  mountPath: /var/run/secrets/kmq/kafka-client
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Security contexts from values (podSecurityContext, containerSecurityContext): OpenShift's
restricted SCC assigns the UID itself, so it wants runAsUser/runAsGroup/fsGroup left out. */}}
{{- define "kmq.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext -}}
{{- end -}}

{{- define "kmq.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext -}}
{{- end -}}

{{- define "kmq.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}
