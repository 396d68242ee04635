{{/*
Chart name, truncated to 63 characters (the DNS label limit).
*/}}
{{- define "sink-coordinator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart> unless the release name already contains the chart name.
*/}}
{{- define "sink-coordinator.fullname" -}}
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

{{- define "sink-coordinator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector of the coordinator pods. The component label keeps the migration
Job's pod out of the Service, the PodDisruptionBudget and the ServiceMonitor.
*/}}
{{- define "sink-coordinator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sink-coordinator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: coordinator
{{- end }}

{{- define "sink-coordinator.commonLabels" -}}
helm.sh/chart: {{ include "sink-coordinator.chart" . }}
app.kubernetes.io/name: {{ include "sink-coordinator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sink-coordinator
{{- end }}

{{- define "sink-coordinator.labels" -}}
{{ include "sink-coordinator.commonLabels" . }}
app.kubernetes.io/component: coordinator
{{- end }}

{{- define "sink-coordinator.migrationLabels" -}}
{{ include "sink-coordinator.commonLabels" . }}
app.kubernetes.io/component: migration
{{- end }}

{{/*
Image reference: repository:tag, or repository@digest when a digest is pinned.
*/}}
{{- define "sink-coordinator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "sink-coordinator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sink-coordinator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
ServiceAccount of the migration hook Job. The release's own ServiceAccount does
not exist yet when a pre-install hook runs, so with serviceAccount.create the
hook gets its own hook-managed ServiceAccount.
*/}}
{{- define "sink-coordinator.migrationServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- printf "%s-migrate" (include "sink-coordinator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sink-coordinator.configMapName" -}}
{{- printf "%s-config" (include "sink-coordinator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The Secret the coordinator pods read (envFrom): existingSecret or the chart's own.
*/}}
{{- define "sink-coordinator.secretName" -}}
{{- if .Values.existingSecret }}
{{- .Values.existingSecret }}
{{- else }}
{{- include "sink-coordinator.fullname" . }}
{{- end }}
{{- end }}

{{/*
A token for the chart's Secret, base64: the configured value, else the value the
release's Secret in the cluster already holds (an upgrade keeps it), else 48
new random letters and digits. lookup returns nothing under `helm template`:
every offline render makes new tokens. Called with (list $ key configured).
*/}}
{{- define "sink-coordinator.token" -}}
{{- $root := index . 0 }}
{{- $key := index . 1 }}
{{- $configured := index . 2 }}
{{- if $configured }}
{{- $configured | b64enc }}
{{- else }}
{{- $current := lookup "v1" "Secret" $root.Release.Namespace (include "sink-coordinator.fullname" $root) | default dict }}
{{- dig "data" $key "" $current | default (randAlphaNum 48 | b64enc) }}
{{- end }}
{{- end }}

{{/*
The Secret the migration hook reads: existingSecret (it exists before install),
or a hook-managed copy of the database URL, because the chart's regular Secret
is only created after the pre-install hooks have run.
*/}}
{{- define "sink-coordinator.migrationSecretName" -}}
{{- if .Values.existingSecret }}
{{- .Values.existingSecret }}
{{- else }}
{{- printf "%s-migrate" (include "sink-coordinator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "sink-coordinator.httpScheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/*
Checks the schema cannot express with a readable message. Rendered (for its
failures only) from the templates that depend on them.
*/}}
{{- define "sink-coordinator.validate" -}}
{{- if not .Values.existingSecret }}
{{- $_ := required "database.url is required (an SQLAlchemy URL such as postgresql+psycopg://user:pass@host:5432/db), unless existingSecret names a Secret holding SINK_COORDINATOR_DATABASE_URL" .Values.database.url }}
{{- else }}
{{- if or .Values.database.url .Values.auth.adminToken .Values.auth.writerToken .Values.catalog.secretProperties }}
{{- fail "existingSecret is set: leave database.url, auth.adminToken, auth.writerToken and catalog.secretProperties empty and put them in that Secret" }}
{{- end }}
{{- end }}
{{- if and .Values.auth.insecure (or .Values.auth.adminToken .Values.auth.writerToken) }}
{{- fail "auth.insecure is true, which serves both APIs without tokens: leave auth.adminToken and auth.writerToken empty, or drop auth.insecure" }}
{{- end }}
{{- $failpoints := list "SINK_COORDINATOR_FAILPOINTS" "SINK_COORDINATOR_ENABLE_FAILPOINTS" }}
{{- $names := keys .Values.config.extra }}
{{- range .Values.extraEnv }}
{{- $names = append $names .name }}
{{- end }}
{{- range $name := $names }}
{{- if has $name $failpoints }}
{{- fail (printf "%s is set (config.extra or extraEnv): failpoints kill or stall the coordinator on purpose, for tests only, and the chart never arms them" $name) }}
{{- end }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled needs tls.secretName (a kubernetes.io/tls Secret with tls.crt and tls.key)" }}
{{- end }}
{{- end }}

{{/*
Pod and container security settings shared by the Deployment and the migration Job.
*/}}
{{- define "sink-coordinator.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end }}

{{- define "sink-coordinator.containerSecurityContext" -}}
{{- toYaml .Values.securityContext }}
{{- end }}
