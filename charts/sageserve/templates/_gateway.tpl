{{/* Gateway API Inference Extension settings of the operator (docs/gateway.md). */}}
{{- define "sageserve.gateway.env" -}}
{{- $g := .Values.gateway -}}
- name: SAGESERVE_INFERENCE_POOLS
  value: {{ ternary "auto" "off" $g.inferencePool.enabled | quote }}
{{- if and $g.inferencePool.enabled $g.endpointPicker.service }}
- name: SAGESERVE_ENDPOINT_PICKER
  value: {{ printf "%s:%d:%s" $g.endpointPicker.service (int $g.endpointPicker.port) $g.endpointPicker.failureMode | quote }}
{{- end }}
{{- end -}}
