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
Whether this render reads the cluster: "true", or "" under `helm template`, `helm install --dry-run` without
=server, and the tools that render that way (Argo CD). lookup answers nothing at all there, while a cluster
answers a list of the release namespace's Secrets, even an empty one (Helm's own release storage lists them, so
whoever installs the chart may).
*/}}
{{- define "sink-coordinator.readsCluster" -}}
{{- if lookup "v1" "Secret" .Release.Namespace "" }}true{{ end }}
{{- end }}

{{/*
A token for the chart's Secret, base64: the configured value; else, with auth.tokenSeed, one derived from the seed
(the same at every render, with or without the cluster); else the value the release's Secret in the cluster
already holds (an upgrade keeps it), or 48 new random letters and digits on a render that reads the cluster (a
first install). A render that cannot read the cluster refuses to make one: it would be another at every render,
and every sync of a tool that renders that way would change the tokens. Called with
(list $ key configured readsCluster).
*/}}
{{- define "sink-coordinator.token" -}}
{{- $root := index . 0 }}
{{- $key := index . 1 }}
{{- $configured := index . 2 }}
{{- $readsCluster := index . 3 }}
{{- if $configured }}
{{- $configured | b64enc }}
{{- else if $root.Values.auth.tokenSeed }}
{{- include "sink-coordinator.derivedToken" (list $root $key $root.Values.auth.tokenSeed) | b64enc }}
{{- else }}
{{- $name := include "sink-coordinator.fullname" $root }}
{{- $current := lookup "v1" "Secret" $root.Release.Namespace $name | default dict }}
{{- $kept := dig "data" $key "" $current }}
{{- include "sink-coordinator.requireLongToken" (list $key $name (b64dec $kept)) }}
{{- if $kept }}
{{- $kept }}
{{- else if $readsCluster }}
{{- randAlphaNum 48 | b64enc }}
{{- else }}
{{- fail (printf "%s is left empty, and this render cannot read the cluster (helm template, Argo CD, helm install --dry-run without =server): a generated token would be another at every render, and each sync would change the tokens writers and operators use. Set auth.tokenSeed (openssl rand -hex 32; every token left empty is derived from it, the same at every render), set the tokens in values, or use existingSecret; docs/deploying.md, \"Rendering without the cluster\"" $key) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A token derived from a seed (auth.tokenSeed, or auth.previousTokenSeed for the tokens it replaces): the SHA-256, in
hex (64 characters), of a fixed prefix, the release's namespace and name, the token's key and the seed, one a line.
A token shows nothing of the seed or of the other tokens; another release, or another key, gets another token.
Called with (list $ key seed).
*/}}
{{- define "sink-coordinator.derivedToken" -}}
{{- $root := index . 0 }}
{{- $key := index . 1 }}
{{- $seed := index . 2 }}
{{- printf "sink-coordinator token\n%s\n%s\n%s\n%s" $root.Release.Namespace $root.Release.Name $key $seed | sha256sum }}
{{- end }}

{{/*
Refuse a token the coordinator would refuse at start (set but shorter than 32
characters), read from a Secret in the cluster. Called with (list key secret value).
*/}}
{{- define "sink-coordinator.requireLongToken" -}}
{{- $key := index . 0 }}
{{- $secret := index . 1 }}
{{- $value := index . 2 }}
{{- if and $value (lt (len $value) 32) }}
{{- fail (printf "%s in Secret %s has %d characters: the coordinator refuses tokens under 32 at start. Set a longer one (openssl rand -hex 32), or delete the key from the chart's Secret to have one generated" $key $secret (len $value)) }}
{{- end }}
{{- end }}

{{/*
The environment variable names of the tokens the pods need by name: the admin
token, the unscoped writer token (auth.unscopedWriterToken), each scope's token.
*/}}
{{- define "sink-coordinator.requiredTokenKeys" -}}
{{- $keys := list "SINK_COORDINATOR_ADMIN_TOKEN" }}
{{- if .Values.auth.unscopedWriterToken }}
{{- $keys = append $keys "SINK_COORDINATOR_WRITER_TOKEN" }}
{{- end }}
{{- range $scope := keys .Values.auth.writerScopes | sortAlpha }}
{{- $keys = append $keys (printf "SINK_COORDINATOR_WRITER_SCOPES__%s__TOKEN" $scope) }}
{{- end }}
{{- toJson $keys }}
{{- end }}

{{/*
The host names the admin API and the console answer: localhost, the Service's
names, and allowedHosts.
*/}}
{{- define "sink-coordinator.allowedHosts" -}}
{{- $fullname := include "sink-coordinator.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $hosts := list "localhost" "127.0.0.1" "::1" $fullname (printf "%s.%s" $fullname $ns) (printf "%s.%s.svc" $fullname $ns) (printf "%s.%s.svc.%s" $fullname $ns .Values.clusterDomain) }}
{{- join "," (concat $hosts .Values.allowedHosts) }}
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

{{/*
Serving processes per pod (SINK_COORDINATOR_PROCESSES): config.processes, or the container's CPU request rounded
up ("100m" and "1" are 1, "1500m" and "1.5" are 2), at least 1; none requested: 1.
*/}}
{{- define "sink-coordinator.processes" -}}
{{- if not (kindIs "invalid" .Values.config.processes) }}
{{- .Values.config.processes | int64 }}
{{- else }}
{{- $cpu := toString ((.Values.resources.requests | default dict).cpu | default "1") }}
{{- $cores := 1.0 }}
{{- if hasSuffix "m" $cpu }}
{{- $cores = divf (trimSuffix "m" $cpu | float64) 1000 }}
{{- else }}
{{- $cores = $cpu | float64 }}
{{- end }}
{{- max 1 (ceil $cores | int64) }}
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
{{- $scopeTokens := list }}
{{- range .Values.auth.writerScopes }}
{{- $scopeTokens = append $scopeTokens (.token | default "") }}
{{- end }}
{{- if or .Values.database.url .Values.auth.adminToken .Values.auth.writerToken .Values.auth.metricsToken .Values.auth.tokenSeed .Values.auth.previousTokenSeed .Values.catalog.secretProperties (compact $scopeTokens) }}
{{- fail "existingSecret is set: leave database.url, auth.adminToken, auth.writerToken, auth.metricsToken, auth.tokenSeed, auth.previousTokenSeed, the writer scopes' tokens and catalog.secretProperties empty and put them in that Secret" }}
{{- end }}
{{- if not .Values.auth.insecure }}
{{- /* What the cluster shows of existingSecret (nothing under `helm template`): its tokens must be long enough. */}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace .Values.existingSecret | default dict }}
{{- range $key := include "sink-coordinator.requiredTokenKeys" . | fromJsonArray }}
{{- if hasKey (dig "data" dict $existing) $key }}
{{- include "sink-coordinator.requireLongToken" (list $key $.Values.existingSecret (b64dec (index $existing.data $key)) ) }}
{{- if not (b64dec (index $existing.data $key)) }}
{{- fail (printf "%s in Secret %s is empty: the coordinator refuses an empty token at start" $key $.Values.existingSecret) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.auth.insecure (or .Values.auth.adminToken .Values.auth.writerToken .Values.auth.metricsToken .Values.auth.tokenSeed .Values.auth.previousTokenSeed .Values.auth.writerScopes) }}
{{- fail "auth.insecure is true, which serves both APIs without tokens: leave auth.adminToken, auth.writerToken, auth.metricsToken, auth.tokenSeed, auth.previousTokenSeed and auth.writerScopes empty, or drop auth.insecure" }}
{{- end }}
{{- $verification := .Values.config.verification | default dict }}
{{- if and $verification.kafkaOptions (not $verification.bootstrapServers) }}
{{- fail "config.verification.kafkaOptions are set without config.verification.bootstrapServers: set the servers too, or drop the options" }}
{{- end }}
{{- range $name, $value := $verification.kafkaOptions }}
{{- if or (contains "password" $name) (contains "secret" $name) }}
{{- fail (printf "config.verification.kafkaOptions.%s would put a secret in a ConfigMap: set SINK_COORDINATOR_VERIFICATION_KAFKA_OPTIONS__%s through extraEnv from a Secret (valueFrom.secretKeyRef)" $name $name) }}
{{- end }}
{{- end }}
{{- if and .Values.auth.previousTokenSeed (not .Values.auth.tokenSeed) }}
{{- fail "auth.previousTokenSeed is set without auth.tokenSeed: a rotation replaces a seed by a new one; set the new one in auth.tokenSeed" }}
{{- end }}
{{- if and .Values.auth.previousTokenSeed (eq .Values.auth.previousTokenSeed .Values.auth.tokenSeed) }}
{{- fail "auth.previousTokenSeed is auth.tokenSeed: a rotation needs a new seed in auth.tokenSeed" }}
{{- end }}
{{- if and (not .Values.auth.insecure) (not .Values.auth.unscopedWriterToken) (not .Values.auth.writerScopes) }}
{{- fail "auth.unscopedWriterToken is false and auth.writerScopes is empty: no writer could call the coordinator; give the writers scopes, or keep the unscoped token" }}
{{- end }}
{{- /* The coordinator reads variable names case-insensitively: so does this guard. */}}
{{- $failpoints := list "SINK_COORDINATOR_FAILPOINTS" "SINK_COORDINATOR_ENABLE_FAILPOINTS" }}
{{- $names := keys .Values.config.extra }}
{{- range .Values.extraEnv }}
{{- $names = append $names .name }}
{{- end }}
{{- range $name := $names }}
{{- if has (upper $name) $failpoints }}
{{- fail (printf "%s is set (config.extra or extraEnv): failpoints kill or stall the coordinator on purpose, for tests only, and the chart never arms them" $name) }}
{{- end }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled needs tls.secretName (a kubernetes.io/tls Secret with tls.crt and tls.key)" }}
{{- end }}
{{- /* The tables live where every pod and every executor reaches them: without a catalog the coordinator would
keep them in a SQL catalog whose warehouse is the pod's scratch disk (an emptyDir that goes with the pod). */}}
{{- $catalog := merge (dict) (.Values.catalog.properties | default dict) (.Values.catalog.secretProperties | default dict) }}
{{- if not (or (hasKey $catalog "type") (hasKey $catalog "uri")) }}
{{- fail "catalog.properties names no catalog (no type, no uri): the coordinator would keep the tables in a SQL catalog with its warehouse on the pod's scratch disk, which Spark executors in other pods cannot write and which goes with the pod. Set catalog.properties: type, uri and a warehouse every pod and executor reaches (s3://bucket/warehouse); docs/deploying.md, \"The Iceberg catalog\"" }}
{{- end }}
{{- $warehouse := toString (index $catalog "warehouse" | default "") }}
{{- if and (or (hasPrefix "file:" (lower $warehouse)) (hasPrefix "/" $warehouse)) (not .Values.catalog.allowLocalWarehouse) }}
{{- fail (printf "catalog.properties.warehouse %s is a path on the pod's file system, which Spark executors in other pods cannot write: use an object store (s3://bucket/warehouse), or set catalog.allowLocalWarehouse: true if every pod and executor mounts that path (a shared volume, extraVolumes)" $warehouse) }}
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
