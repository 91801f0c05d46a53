{{/*
Names, labels and the pieces every PagedWeight pod shares.
*/}}

{{- define "pagedweight.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-pagedweight, or the release name when it already says pagedweight. */}}
{{- define "pagedweight.fullname" -}}
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

{{- define "pagedweight.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; pass (dict "ctx" $ "component" "router"). */}}
{{- define "pagedweight.labels" -}}
helm.sh/chart: {{ include "pagedweight.chart" .ctx }}
{{ include "pagedweight.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: pagedweight
{{- end }}

{{/* The labels a selector matches: name, instance and, when given, the component. */}}
{{- define "pagedweight.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pagedweight.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{- define "pagedweight.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "pagedweight.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pagedweight.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The router's Service: the OpenAI API for clients, the control port for the workers. */}}
{{- define "pagedweight.routerService" -}}
{{- printf "%s-router" (include "pagedweight.fullname" .) }}
{{- end }}

{{/* The routers' control port for the workers: a headless Service, one address per router pod. */}}
{{- define "pagedweight.routerControlService" -}}
{{- printf "%s-router-pods" (include "pagedweight.fullname" .) }}
{{- end }}

{{/* A worker's routers: every router pod under the headless Service, resolved again every
router.resolveMs (services/workers/common/router_links.h). */}}
{{- define "pagedweight.routerArgs" -}}
- --router
- tcp://{{ include "pagedweight.routerControlService" . }}:{{ .Values.router.controlPort }}
- --router-resolve-ms
- {{ .Values.router.resolveMs | int | quote }}
{{- end }}

{{- define "pagedweight.controlKeysSecret" -}}
{{- default (printf "%s-control-keys" (include "pagedweight.fullname" .)) .Values.controlPlane.existingSecret }}
{{- end }}

{{- define "pagedweight.apiKeysSecret" -}}
{{- default (printf "%s-api-keys" (include "pagedweight.fullname" .)) .Values.apiKeys.existingSecret }}
{{- end }}

{{/* Where the model and its store are, as the pods see them. */}}
{{- define "pagedweight.modelDir" -}}
{{- if eq .Values.model.storage "image" }}
{{- .Values.model.path }}
{{- else }}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) .Values.model.path }}
{{- end }}
{{- end }}

{{- define "pagedweight.storePath" -}}
{{- if eq .Values.model.storage "image" }}
{{- .Values.model.store.path }}
{{- else }}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) .Values.model.store.path }}
{{- end }}
{{- end }}

{{/*
Checks the schema cannot express (values.schema.json has the rest); each fails the render
with the value's path.
*/}}
{{- define "pagedweight.validate" -}}
{{- $v := .Values }}
{{- if and $v.controlPlane.insecure (or $v.controlPlane.existingSecret $v.controlPlane.keys) }}
{{- fail "controlPlane: insecure is true but keys are given; choose one" }}
{{- end }}
{{- if and $v.model.store.build (ne $v.model.storage "pvc") }}
{{- fail (printf "model.store.build: the store is built once into a shared volume; model.storage must be pvc, not %s (with hostPath prepare each node's store with pw-quantize)" $v.model.storage) }}
{{- end }}
{{- if and $v.model.store.build (not $v.model.store.enabled) }}
{{- fail "model.store.build: true needs model.store.enabled: true" }}
{{- end }}
{{- /* A decode pool must hold at least one expert at the lowest width the planner may give it. */}}
{{- $g := $v.model.geometry }}
{{- if gt (int $v.decode.poolMb) 0 }}
{{- $bits := int $v.model.store.lowestBits }}
{{- $expertBytes := div (mul 3 (int $g.hiddenSize) (int $g.moeIntermediateSize) $bits) 8 }}
{{- $poolBytes := mul (int $v.decode.poolMb) 1048576 }}
{{- if lt $poolBytes $expertBytes }}
{{- fail (printf "decode.poolMb: %d MiB is smaller than one expert at %d bits (%d bytes: 3 matrices of %d x %d; model.geometry)" (int $v.decode.poolMb) $bits $expertBytes (int $g.hiddenSize) (int $g.moeIntermediateSize)) }}
{{- end }}
{{- end }}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- fail (printf "autoscaling: minReplicas %d is above maxReplicas %d" (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- end }}
{{- end }}
