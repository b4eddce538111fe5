{{- define "jetgate.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "jetgate.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "jetgate.labels" -}}
app.kubernetes.io/name: {{ include "jetgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "jetgate.selector" -}}
app.kubernetes.io/name: {{ include "jetgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "jetgate.secretName" -}}
{{- if .Values.secrets.existingSecret -}}{{ .Values.secrets.existingSecret }}{{- else -}}{{ include "jetgate.fullname" . }}{{- end -}}
{{- end -}}

{{/* Environment shared by every jetgate container. */}}
{{- define "jetgate.env" -}}
- name: JETGATE_ENV
  value: production
- name: JETGATE_NATS_URL
  value: {{ .Values.nats.url | quote }}
- name: JETGATE_REDIS_URL
  value: {{ .Values.redis.url | quote }}
- name: JETGATE_REDIS_CLUSTER
  value: {{ .Values.redis.cluster | quote }}
# health and metrics listen on the pod's address (probes, Prometheus); no Service for devices has their port
- name: JETGATE_METRICS_HOST
  value: "0.0.0.0"
{{- if .Values.secrets.jwtPublicKeys }}
- name: JETGATE_JWT_PUBLIC_KEYS_FILE
  value: /etc/jetgate/jwt/keys
{{- end }}
{{- end -}}

{{- define "jetgate.envFrom" -}}
- configMapRef:
    name: {{ include "jetgate.fullname" . }}
- secretRef:
    name: {{ include "jetgate.secretName" . }}
{{- end -}}

{{- define "jetgate.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.secrets.jwtPublicKeys }}
- name: jwt
  secret:
    secretName: {{ include "jetgate.fullname" . }}-jwt
{{- end }}
{{- end -}}

{{- define "jetgate.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.secrets.jwtPublicKeys }}
- name: jwt
  mountPath: /etc/jetgate/jwt
  readOnly: true
{{- end }}
{{- end -}}

{{/* The service tokens file's Secret (the chart's, or the user's), when there is one: gateways only. */}}
{{- define "jetgate.serviceTokensSecret" -}}
{{- if .Values.secrets.serviceTokensSecret -}}{{ .Values.secrets.serviceTokensSecret }}{{- else if .Values.secrets.serviceTokens -}}{{ include "jetgate.fullname" . }}-service-tokens{{- end -}}
{{- end -}}
