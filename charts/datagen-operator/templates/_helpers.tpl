{{/* Names and labels shared by every template. */}}

{{- define "datagen-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release-scoped name; cluster-scoped objects (ClusterRole, bindings) use it too, so two
releases in different namespaces never collide. */}}
{{- define "datagen-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "datagen-operator.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "datagen-operator.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "datagen-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "datagen-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "datagen-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "datagen-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: datagen-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "datagen-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "datagen-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The namespaces the operator watches, as a JSON list (`fromJsonArray`); empty: all namespaces. */}}
{{- define "datagen-operator.watchNamespaces" -}}
{{- if eq .Values.watch.scope "namespaces" }}
{{- default (list .Release.Namespace) .Values.watch.namespaces | uniq | toJson }}
{{- else }}
{{- list | toJson }}
{{- end }}
{{- end }}

{{- define "datagen-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "datagen-operator.workerImage" -}}
{{- $tag := default .Chart.AppVersion .Values.workerImage.tag }}
{{- if .Values.workerImage.digest }}
{{- printf "%s:%s@%s" .Values.workerImage.repository $tag .Values.workerImage.digest }}
{{- else }}
{{- printf "%s:%s" .Values.workerImage.repository $tag }}
{{- end }}
{{- end }}

{{/* Peering (kopf's keep-alives between replicas) is on with more than one replica, or when asked. */}}
{{- define "datagen-operator.peering" -}}
{{- if or (gt (int .Values.replicas) 1) .Values.peering.enabled }}true{{ end }}
{{- end }}

{{- define "datagen-operator.peeringName" -}}
{{- default (include "datagen-operator.fullname" .) .Values.peering.name }}
{{- end }}
