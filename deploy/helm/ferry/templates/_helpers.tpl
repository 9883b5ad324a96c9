{{/* The chart's name, or nameOverride. */}}
{{- define "ferry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object's name: the release's name when it already says ferry. */}}
{{- define "ferry.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "ferry.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; "component" is added where an object belongs to one. */}}
{{- define "ferry.labels" -}}
app.kubernetes.io/name: {{ include "ferry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The labels that select one component's Pods: call with (dict "root" $ "component" "worker"). */}}
{{- define "ferry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ferry.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "ferry.componentLabels" -}}
{{ include "ferry.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "ferry.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret of the payload codec's keys. */}}
{{- define "ferry.codecSecret" -}}
{{- default (printf "%s-codec-keys" (include "ferry.fullname" .)) .Values.codec.secretName -}}
{{- end -}}

{{/* Where both containers find the codec keys: an item of their env (empty when encryption is off). */}}
{{- define "ferry.codecEnv" -}}
{{- if .Values.codec.enabled }}
- name: FERRY_CODEC_KEYS
  value: /etc/ferry/codec-keys
{{- end }}
{{- end -}}

{{- define "ferry.claimSecret" -}}
{{- default (printf "%s-claim-key" (include "ferry.fullname" .)) .Values.claimKey.secretName -}}
{{- end -}}

{{- define "ferry.claimEnv" -}}
{{- if .Values.claimKey.enabled }}
- name: FERRY_CLAIM_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "ferry.claimSecret" . }}
      key: key
{{- end }}
{{- end -}}

{{- define "ferry.leaseName" -}}
{{- default (printf "%s-watcher" (include "ferry.fullname" .)) .Values.watcher.leaseName -}}
{{- end -}}

{{/*
What the worker's and the watcher's Pods have in common, around their one container's
args and env: call with (dict "root" $ "component" "worker" "values" .Values.worker).
*/}}
{{- define "ferry.podSpec" -}}
{{- $root := .root -}}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "ferry.selectorLabels" . | nindent 8 }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumes:
  - name: tmp
    emptyDir:
      sizeLimit: {{ .values.tmpSizeLimit }}
  {{- if $root.Values.codec.enabled }}
  - name: codec-keys
    secret:
      secretName: {{ include "ferry.codecSecret" $root }}
  {{- end }}
  {{- with $root.Values.extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* The container's fields after args and env. */}}
{{- define "ferry.containerTail" -}}
{{- $root := .root -}}
envFrom:
  - configMapRef:
      name: {{ include "ferry.fullname" $root }}-config
  {{- with $root.Values.envFrom }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  - name: health
    containerPort: {{ $root.Values.ports.health }}
  - name: metrics
    containerPort: {{ $root.Values.ports.metrics }}
livenessProbe:
  httpGet: {path: /healthz, port: health}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: health}
  periodSeconds: 5
resources:
  {{- toYaml .values.resources | nindent 2 }}
securityContext:
  {{- toYaml $root.Values.securityContext | nindent 2 }}
volumeMounts:
  - name: tmp
    mountPath: /tmp
  {{- if $root.Values.codec.enabled }}
  - name: codec-keys
    mountPath: /etc/ferry/codec-keys
    readOnly: true
  {{- end }}
  {{- with $root.Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}
