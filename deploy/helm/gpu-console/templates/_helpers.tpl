{{- define "gc.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "gc.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gc.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gc.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-console" (include "gc.fullname" .)) -}}
{{- end -}}

{{- define "gc.consoleImage" -}}
{{ .Values.image.console.repository }}:{{ .Values.image.console.tag }}
{{- end -}}

{{/* Environment shared by the web, worker, beat and migration pods. */}}
{{- define "gc.consoleEnv" -}}
- name: CONSOLE_MODE
  value: production
- name: DJANGO_ALLOWED_HOSTS
  value: {{ join "," .Values.console.hosts | quote }}
- name: DJANGO_CSRF_TRUSTED_ORIGINS
  value: {{ include "gc.origins" . | quote }}
- name: CONSOLE_VAR_DIR
  value: /var/lib/gpu-console
- name: CONSOLE_ARTIFACTS
  value: file:///artifacts
- name: CONSOLE_SCHEDULER_POLICY
  value: {{ .Values.console.schedulerPolicy | quote }}
- name: CONSOLE_TRUSTED_PROXIES
  value: {{ join "," .Values.console.trustedProxies | quote }}
{{- range $name, $value := .Values.console.extraEnv }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- range $key := list "DJANGO_SECRET_KEY" "CONSOLE_SECRETS_KEY" "DATABASE_URL" "CELERY_BROKER_URL" "REDIS_URL" "CONSOLE_METRICS_TOKEN" }}
- name: {{ $key }}
  valueFrom:
    secretKeyRef:
      name: {{ include "gc.secretName" $ }}
      key: {{ $key }}
      optional: {{ eq $key "CONSOLE_METRICS_TOKEN" }}
{{- end }}
{{- end -}}

{{- define "gc.origins" -}}
{{- $origins := list -}}
{{- range .Values.console.hosts }}{{ $origins = append $origins (printf "https://%s" .) }}{{ end -}}
{{- join "," $origins -}}
{{- end -}}

{{- define "gc.artifactsVolume" -}}
- name: artifacts
{{- if .Values.artifacts.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.artifacts.existingClaim }}
{{- else }}
  hostPath:
    path: {{ .Values.artifacts.hostPath }}
    type: DirectoryOrCreate
{{- end }}
{{- end -}}

{{- define "gc.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 999
  runAsGroup: 999
  fsGroup: 999
{{- end -}}
