{{/* Names and labels shared by every template. */}}
{{- define "sageserve.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sageserve.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sageserve.labels" -}}
{{ include "sageserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sageserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sageserve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The router: its own name, labels and ServiceAccount. Its pods carry
     app.kubernetes.io/name=<chart>-router so the operator's selector never matches them. */}}
{{- define "sageserve.router.fullname" -}}
{{- printf "%s-router" (include "sageserve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sageserve.router.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-router
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sageserve.router.labels" -}}
{{ include "sageserve.router.selectorLabels" . }}
app.kubernetes.io/component: router
app.kubernetes.io/part-of: {{ .Chart.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sageserve.router.serviceAccountName" -}}
{{- if .Values.router.serviceAccount.create -}}
{{- default (include "sageserve.router.fullname" .) .Values.router.serviceAccount.name -}}
{{- else -}}
{{- required "router.serviceAccount.name is required when router.serviceAccount.create is false" .Values.router.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespaces the router serves, as a JSON list: router.namespaces, else
     watchNamespaces, else the release namespace (the router watches named namespaces only). */}}
{{- define "sageserve.router.namespaces" -}}
{{- $member := ternary .Values.fleet.member.namespaces list .Values.fleet.member.enabled -}}
{{- $ns := .Values.router.namespaces | default $member | default .Values.watchNamespaces | default (list .Release.Namespace) -}}
{{- $ns | uniq | toJson -}}
{{- end -}}

{{/* Whether this install runs a router: always outside a member cluster; in a member
     (fleet.member.enabled) only with fleet.member.hubKubeconfigSecret, the hub's catalogue. */}}
{{- define "sageserve.router.here" -}}
{{- if or (not .Values.fleet.member.enabled) .Values.fleet.member.hubKubeconfigSecret -}}true{{- end -}}
{{- end -}}
