{{/*
Names. Kubernetes names are DNS labels: at most 63 characters, no trailing dash.
*/}}
{{- define "matcher.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "matcher.fullname" -}}
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

{{- define "matcher.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Kubernetes recommended labels, on every object.
*/}}
{{- define "matcher.labels" -}}
helm.sh/chart: {{ include "matcher.chart" . }}
{{ include "matcher.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: matcher
{{- end }}

{{/*
Selector labels. The daemon's selectors add component=daemon so that they never pick up
the migration Job's pods, which share name and instance.
*/}}
{{- define "matcher.selectorLabels" -}}
app.kubernetes.io/name: {{ include "matcher.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "matcher.daemonSelectorLabels" -}}
{{ include "matcher.selectorLabels" . }}
app.kubernetes.io/component: daemon
{{- end }}

{{- define "matcher.webhooksSelectorLabels" -}}
{{ include "matcher.selectorLabels" . }}
app.kubernetes.io/component: webhooks
{{- end }}

{{/*
The webhook ingress's objects: <fullname>-webhooks.
*/}}
{{- define "matcher.webhooksName" -}}
{{- printf "%s-webhooks" (include "matcher.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "matcher.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "matcher.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The migration Job runs before the release's own objects exist on first install, so it
cannot use the daemon's ServiceAccount: it gets a hook ServiceAccount of its own.
*/}}
{{- define "matcher.migrationServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- printf "%s-migrate" (include "matcher.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- include "matcher.serviceAccountName" . }}
{{- end }}
{{- end }}

{{/*
The ingress gets a ServiceAccount of its own when the chart creates them: whatever the
daemon's carries (a cloud identity for the database, say) must not reach the pods that face
the internet. With serviceAccount.create false it uses the one named there.
*/}}
{{- define "matcher.webhooksServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- include "matcher.webhooksName" . }}
{{- else }}
{{- include "matcher.serviceAccountName" . }}
{{- end }}
{{- end }}

{{- define "matcher.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "matcher.devSecretName" -}}
{{- printf "%s-dev" (include "matcher.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Secret references: "<secret name> <key>", from existingSecret, else from the development
Secret when createSecret holds the value, else empty (or a rendering error when required).
*/}}
{{- define "matcher.databaseSecret" -}}
{{- if .Values.database.url.existingSecret }}
{{- printf "%s %s" .Values.database.url.existingSecret .Values.database.url.key }}
{{- else if and .Values.createSecret.enabled .Values.createSecret.databaseUrl }}
{{- printf "%s database-url" (include "matcher.devSecretName" .) }}
{{- else }}
{{- required "database.url.existingSecret is required: the name of a Secret holding the postgresql:// URI of the database (key database.url.key, default \"url\")" .Values.database.url.existingSecret }}
{{- end }}
{{- end }}

{{- define "matcher.saslSecret" -}}
{{- if .Values.kafka.sasl.password.existingSecret }}
{{- printf "%s %s" .Values.kafka.sasl.password.existingSecret .Values.kafka.sasl.password.key }}
{{- else if and .Values.createSecret.enabled .Values.createSecret.kafkaSaslPassword }}
{{- printf "%s kafka-sasl-password" (include "matcher.devSecretName" .) }}
{{- end }}
{{- end }}

{{- define "matcher.adminTokenSecret" -}}
{{- if .Values.admin.token.existingSecret }}
{{- printf "%s %s" .Values.admin.token.existingSecret .Values.admin.token.key }}
{{- else if and .Values.createSecret.enabled .Values.createSecret.adminToken }}
{{- printf "%s admin-token" (include "matcher.devSecretName" .) }}
{{- end }}
{{- end }}

{{- define "matcher.producersSecret" -}}
{{- if .Values.producers.existingSecret }}
{{- printf "%s %s" .Values.producers.existingSecret .Values.producers.key }}
{{- else if and .Values.createSecret.enabled .Values.createSecret.producersToml }}
{{- printf "%s producers.toml" (include "matcher.devSecretName" .) }}
{{- end }}
{{- end }}

{{- define "matcher.saslEnabled" -}}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol }}true{{ end }}
{{- end }}

{{- define "matcher.tlsEnabled" -}}
{{- if has .Values.kafka.securityProtocol (list "SSL" "SASL_SSL") }}true{{ end }}
{{- end }}

{{/*
Seconds between SIGTERM and SIGKILL: explicit, or the shutdown timeout plus a margin for
the last batch's commit and the process exit.
*/}}
{{- define "matcher.terminationGracePeriodSeconds" -}}
{{- $shutdown := float64 .Values.shutdownTimeoutSeconds }}
{{- $grace := .Values.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $grace }}
{{- $grace = add (int (ceil $shutdown)) 15 }}
{{- end }}
{{- if le (float64 $grace) $shutdown }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be longer than shutdownTimeoutSeconds (%v): otherwise Kubernetes kills a daemon in the middle of its clean shutdown" $grace .Values.shutdownTimeoutSeconds) }}
{{- end }}
{{- int $grace }}
{{- end }}

{{/*
The ingress's seconds between being told to stop and SIGKILL: explicit, or the preStop
sleep plus the drain plus a margin. Kubernetes counts the preStop hook against the grace
period, so it must outlast both or in-flight requests are cut off.
*/}}
{{- define "matcher.webhooksTerminationGracePeriodSeconds" -}}
{{- $w := .Values.webhooks }}
{{- $busy := addf (float64 $w.preStopSleepSeconds) (float64 $w.drainTimeoutSeconds) }}
{{- $grace := $w.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $grace }}
{{- $grace = add (int (ceil $busy)) 10 }}
{{- end }}
{{- if le (float64 $grace) $busy }}
{{- fail (printf "webhooks.terminationGracePeriodSeconds (%v) must be longer than webhooks.preStopSleepSeconds + webhooks.drainTimeoutSeconds (%v + %v): otherwise Kubernetes kills an ingress pod while it still drains requests" $grace $w.preStopSleepSeconds $w.drainTimeoutSeconds) }}
{{- end }}
{{- int $grace }}
{{- end }}

{{/*
A value as an env var string. Helm reads every number in values as a float, which would
print 2000000 as "2e+06": whole numbers are printed as integers.
*/}}
{{- define "matcher.str" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}
{{- int64 . }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{/*
The non-secret settings every process on the events topic needs (the daemon, the
migration Job and the webhook ingress): Kafka, the events topic, the producer registry,
logging. A YAML map of env var name to string.
*/}}
{{- define "matcher.kafkaEnv" -}}
{{- $v := .Values }}
{{- $env := dict }}
{{- $_ := set $env "MATCHER_KAFKA_BOOTSTRAP_SERVERS" (required "kafka.bootstrapServers is required: the comma-separated host:port list of the Kafka brokers" $v.kafka.bootstrapServers) }}
{{- $_ := set $env "MATCHER_KAFKA_SECURITY_PROTOCOL" $v.kafka.securityProtocol }}
{{- if include "matcher.saslEnabled" . }}
{{- $_ := set $env "MATCHER_KAFKA_SASL_MECHANISM" $v.kafka.sasl.mechanism }}
{{- $_ := set $env "MATCHER_KAFKA_SASL_USERNAME" $v.kafka.sasl.username }}
{{- end }}
{{- if and (include "matcher.tlsEnabled" .) $v.kafka.tls.existingSecret }}
{{- if $v.kafka.tls.caKey }}
{{- $_ := set $env "MATCHER_KAFKA_SSL_CAFILE" (printf "%s/%s" $v.kafka.tls.mountPath $v.kafka.tls.caKey) }}
{{- end }}
{{- if $v.kafka.tls.certKey }}
{{- $_ := set $env "MATCHER_KAFKA_SSL_CERTFILE" (printf "%s/%s" $v.kafka.tls.mountPath $v.kafka.tls.certKey) }}
{{- $_ := set $env "MATCHER_KAFKA_SSL_KEYFILE" (printf "%s/%s" $v.kafka.tls.mountPath $v.kafka.tls.keyKey) }}
{{- end }}
{{- end }}
{{- $_ := set $env "MATCHER_EVENTS_TOPIC" $v.kafka.eventsTopic }}
{{- if include "matcher.producersSecret" . }}
{{- $_ := set $env "MATCHER_PRODUCERS_FILE" (printf "%s/producers.toml" $v.producers.mountPath) }}
{{- end }}
{{- $_ := set $env "MATCHER_ALLOW_UNSIGNED" (toString $v.producers.allowUnsigned) }}
{{- $_ := set $env "MATCHER_LOG_LEVEL" $v.log.level }}
{{- $_ := set $env "MATCHER_LOG_FORMAT" $v.log.format }}
{{- toYaml $env }}
{{- end }}

{{/*
Adds extra settings to an env map, refusing secrets and the names the chart sets itself.
Called with (dict "env" ENV "chartSet" NAMES-MAP "config" EXTRAS "path" VALUES-PATH); ENV
is changed in place.
*/}}
{{- define "matcher.addConfig" -}}
{{- $secretNames := list "MATCHER_DATABASE_URL" "MATCHER_KAFKA_SASL_PASSWORD" "MATCHER_ADMIN_TOKEN" }}
{{- range $name, $value := .config }}
{{- if has $name $secretNames }}
{{- fail (printf "%s.%s: secrets do not belong in the ConfigMap; reference a Secret (see database.url, kafka.sasl.password, admin.token)" $.path $name) }}
{{- end }}
{{- if hasKey $.chartSet $name }}
{{- fail (printf "%s.%s: the chart sets this variable from its own values; set that value instead of overriding it here" $.path $name) }}
{{- end }}
{{- $_ := set $.env $name (include "matcher.str" $value) }}
{{- end }}
{{- end }}

{{/*
The daemon's non-secret settings as a YAML map of env var name to string. One definition
feeds the ConfigMap (daemon) and the migration Job's inline env, so both always agree.
*/}}
{{- define "matcher.configEnv" -}}
{{- $v := .Values }}
{{- $env := include "matcher.kafkaEnv" . | fromYaml }}
{{- $_ := set $env "MATCHER_RESUME_TOPIC" $v.kafka.resumeTopic }}
{{- if $v.kafka.deadLetterTopic }}
{{- $_ := set $env "MATCHER_DEAD_LETTER_TOPIC" $v.kafka.deadLetterTopic }}
{{- end }}
{{- $_ := set $env "MATCHER_TOPIC_PARTITIONS" (include "matcher.str" $v.kafka.topicPartitions) }}
{{- if not (kindIs "invalid" $v.kafka.topicReplicationFactor) }}
{{- $_ := set $env "MATCHER_TOPIC_REPLICATION_FACTOR" (include "matcher.str" $v.kafka.topicReplicationFactor) }}
{{- end }}
{{- $_ := set $env "MATCHER_CONSUMER_GROUP" $v.kafka.consumerGroup }}
{{- $_ := set $env "MATCHER_DB_POOL_MAX_SIZE" (include "matcher.str" $v.database.poolMaxSize) }}
{{- $_ := set $env "MATCHER_INBOX_RETENTION" (include "matcher.str" $v.inbox.retention) }}
{{- $_ := set $env "MATCHER_INBOX_PURGE_AFTER" (include "matcher.str" $v.inbox.purgeAfter) }}
{{- $_ := set $env "MATCHER_SHUTDOWN_TIMEOUT_S" (include "matcher.str" $v.shutdownTimeoutSeconds) }}
{{- $_ := set $env "MATCHER_ADMIN_ADDRESS" (printf "0.0.0.0:%d" (int $v.admin.port)) }}
{{- $_ := include "matcher.addConfig" (dict "env" $env "chartSet" (deepCopy $env) "config" $v.config "path" "config") }}
{{- toYaml $env }}
{{- end }}

{{/*
The webhook ingress's non-secret settings (its own ConfigMap): what every process on the
events topic gets, its listener and limits, then config (shared with the daemon, so that
both apply the same gate limits; the ingress ignores the daemon's own settings) and
webhooks.config (the ingress's alone). Nothing about the database: the ingress has none.
*/}}
{{- define "matcher.webhooksEnv" -}}
{{- $w := .Values.webhooks }}
{{- $env := include "matcher.kafkaEnv" . | fromYaml }}
{{- $_ := set $env "MATCHER_INGRESS_ADDRESS" (printf "0.0.0.0:%d" (int $w.port)) }}
{{- $_ := set $env "MATCHER_INGRESS_MAX_CONCURRENCY" (include "matcher.str" $w.maxConcurrency) }}
{{- $_ := set $env "MATCHER_INGRESS_READ_TIMEOUT_S" (include "matcher.str" $w.readTimeoutSeconds) }}
{{- $_ := set $env "MATCHER_INGRESS_DRAIN_TIMEOUT_S" (include "matcher.str" $w.drainTimeoutSeconds) }}
{{- $chartSet := deepCopy $env }}
{{- $_ := include "matcher.addConfig" (dict "env" $env "chartSet" $chartSet "config" .Values.config "path" "config") }}
{{- $_ := include "matcher.addConfig" (dict "env" $env "chartSet" $chartSet "config" $w.config "path" "webhooks.config") }}
{{- toYaml $env }}
{{- end }}

{{/*
Render-time checks of combinations a schema cannot express. Each message names the values
to change, so a bad configuration fails at `helm install` rather than in a crash loop.
*/}}
{{- define "matcher.validate" -}}
{{- $v := .Values }}
{{- $_ := include "matcher.databaseSecret" . }}
{{- $_ := include "matcher.configEnv" . }}
{{- if include "matcher.saslEnabled" . }}
{{- if not $v.kafka.sasl.mechanism }}
{{- fail (printf "kafka.sasl.mechanism is required with kafka.securityProtocol=%s (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)" $v.kafka.securityProtocol) }}
{{- end }}
{{- if not $v.kafka.sasl.username }}
{{- fail (printf "kafka.sasl.username is required with kafka.securityProtocol=%s" $v.kafka.securityProtocol) }}
{{- end }}
{{- if not (include "matcher.saslSecret" .) }}
{{- fail (printf "kafka.sasl.password.existingSecret is required with kafka.securityProtocol=%s: the name of a Secret holding the SASL password" $v.kafka.securityProtocol) }}
{{- end }}
{{- end }}
{{- if ne (empty $v.kafka.tls.certKey) (empty $v.kafka.tls.keyKey) }}
{{- fail "kafka.tls.certKey and kafka.tls.keyKey go together: a client certificate needs its key" }}
{{- end }}
{{- if and (not (include "matcher.producersSecret" .)) (not $v.producers.allowUnsigned) }}
{{- fail "producers.existingSecret is required: the name of a Secret holding the producer registry TOML (without it no event can be authenticated; producers.allowUnsigned=true is for local development only)" }}
{{- end }}
{{- if eq $v.kafka.eventsTopic $v.kafka.resumeTopic }}
{{- fail "kafka.eventsTopic and kafka.resumeTopic must be different topics" }}
{{- end }}
{{- if has $v.kafka.deadLetterTopic (list $v.kafka.eventsTopic $v.kafka.resumeTopic) }}
{{- fail "kafka.deadLetterTopic must differ from kafka.eventsTopic and kafka.resumeTopic" }}
{{- end }}
{{- if and (not $v.keda.enabled) (gt (int $v.replicas) (int $v.kafka.topicPartitions)) }}
{{- fail (printf "replicas (%d) must not exceed kafka.topicPartitions (%d): each partition is read by one daemon, so the extra daemons would sit idle" (int $v.replicas) (int $v.kafka.topicPartitions)) }}
{{- end }}
{{- if $v.keda.enabled }}
{{- if gt (int $v.keda.maxReplicaCount) (int $v.kafka.topicPartitions) }}
{{- fail (printf "keda.maxReplicaCount (%d) must not exceed kafka.topicPartitions (%d): each partition is read by one daemon, so the extra daemons would sit idle" (int $v.keda.maxReplicaCount) (int $v.kafka.topicPartitions)) }}
{{- end }}
{{- if gt (int $v.keda.minReplicaCount) (int $v.keda.maxReplicaCount) }}
{{- fail (printf "keda.minReplicaCount (%d) must not exceed keda.maxReplicaCount (%d)" (int $v.keda.minReplicaCount) (int $v.keda.maxReplicaCount)) }}
{{- end }}
{{- end }}
{{- $_ := include "matcher.terminationGracePeriodSeconds" . }}
{{- if $v.webhooks.enabled }}
{{- include "matcher.validateWebhooks" . }}
{{- end }}
{{- end }}

{{- define "matcher.validateWebhooks" -}}
{{- $w := .Values.webhooks }}
{{- $_ := include "matcher.webhooksEnv" . }}
{{- $_ := include "matcher.webhooksTerminationGracePeriodSeconds" . }}
{{- if eq (int $w.port) (int .Values.admin.port) }}
{{- fail (printf "webhooks.port (%d) must differ from admin.port" (int $w.port)) }}
{{- end }}
{{- range $w.extraEnv }}
{{- if eq .name "MATCHER_DATABASE_URL" }}
{{- fail "webhooks.extraEnv: MATCHER_DATABASE_URL: the ingress gets the daemon's database credentials never; give it a role of its own with webhooks.database.existingSecret" }}
{{- end }}
{{- end }}
{{- with $w.database.existingSecret }}
{{- if eq . $.Values.database.url.existingSecret }}
{{- fail "webhooks.database.existingSecret is the daemon's database Secret: the internet-facing ingress must have a role of its own, one that may only EXECUTE matcher.record_refusals_v1 and matcher.complete_callback_v1" }}
{{- end }}
{{- end }}
{{- if and $w.autoscaling.enabled (gt (int $w.autoscaling.minReplicas) (int $w.autoscaling.maxReplicas)) }}
{{- fail (printf "webhooks.autoscaling.minReplicas (%d) must not exceed webhooks.autoscaling.maxReplicas (%d)" (int $w.autoscaling.minReplicas) (int $w.autoscaling.maxReplicas)) }}
{{- end }}
{{- if $w.ingress.enabled }}
{{- if not $w.ingress.hosts }}
{{- fail "webhooks.ingress.hosts is required with webhooks.ingress.enabled: the host names senders post to, e.g. [{host: hooks.example.com}]" }}
{{- end }}
{{- range $w.ingress.hosts }}
{{- range (.paths | default (include "matcher.webhooksPaths" $ | splitList " ")) }}
{{- if or (not (or (hasPrefix "/v1/webhooks/" .) (and $w.database.existingSecret (hasPrefix "/v1/callbacks/" .)))) (contains "/.." .) (contains "//" .) }}
{{- fail (printf "webhooks.ingress.hosts[].paths: %q is not under /v1/webhooks/: the Ingress exposes the webhook endpoint only, never /metrics or the health checks" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Secret-backed env vars, shared by the daemon and the migration Job.
*/}}
{{- define "matcher.secretEnv" -}}
{{- $db := splitList " " (include "matcher.databaseSecret" .) -}}
- name: MATCHER_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ first $db }}
      key: {{ last $db }}
{{- if include "matcher.saslEnabled" . }}
{{- $sasl := splitList " " (include "matcher.saslSecret" .) }}
- name: MATCHER_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ first $sasl }}
      key: {{ last $sasl }}
{{- end }}
{{- with include "matcher.adminTokenSecret" . }}
{{- $token := splitList " " . }}
- name: MATCHER_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ first $token }}
      key: {{ last $token }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The ingress's Secret-backed env vars: the Kafka password when SASL is on, the ingress's own
database role when webhooks.database.existingSecret is set (never the daemon's URL, never
the admin token), then webhooks.extraEnv.
*/}}
{{- define "matcher.webhooksSecretEnv" -}}
{{- with .Values.webhooks.database.existingSecret }}
- name: MATCHER_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.webhooks.database.key }}
{{- end }}
{{- if include "matcher.saslEnabled" . }}
{{- $sasl := splitList " " (include "matcher.saslSecret" .) }}
- name: MATCHER_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ first $sasl }}
      key: {{ last $sasl }}
{{- end }}
{{- with .Values.webhooks.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Volumes: /tmp (the root filesystem is read-only) and the Secret files. Secrets are mounted
as directories, not subPath, so that updates to them reach running pods. The daemon and the
Job add extraVolumes; the ingress gets the base ones only.
*/}}
{{- define "matcher.volumes" -}}
{{ include "matcher.baseVolumes" . }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "matcher.volumeMounts" -}}
{{ include "matcher.baseVolumeMounts" . }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "matcher.baseVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- with include "matcher.producersSecret" . }}
{{- $producers := splitList " " . }}
- name: producers
  secret:
    secretName: {{ first $producers }}
    defaultMode: 0440
    items:
      - key: {{ last $producers }}
        path: producers.toml
{{- end }}
{{- if and (include "matcher.tlsEnabled" .) .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "matcher.baseVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if include "matcher.producersSecret" . }}
- name: producers
  mountPath: {{ .Values.producers.mountPath }}
  readOnly: true
{{- end }}
{{- if and (include "matcher.tlsEnabled" .) .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  mountPath: {{ .Values.kafka.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
The paths the Kubernetes Ingress routes by default: the webhooks, and the callback URLs
when the ingress has a database to complete them with.
*/}}
{{- define "matcher.webhooksPaths" -}}
{{- if .Values.webhooks.database.existingSecret }}/v1/webhooks/ /v1/callbacks/{{ else }}/v1/webhooks/{{ end }}
{{- end }}
