{{/*
Names, labels and the pieces every Sluice container shares.
*/}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name: the release name when it already holds the chart's name. */}}
{{- define "sluice.fullname" -}}
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

{{/* The mode, checked once: every template calls it. */}}
{{- define "sluice.mode" -}}
{{- $m := required "mode is required: sidecar, edge or mesh (start from deploy/values/<mode>.yaml)" .Values.mode }}
{{- if not (has $m (list "sidecar" "edge" "mesh")) }}
{{- fail (printf "mode: %q is not sidecar, edge or mesh" $m) }}
{{- end }}
{{- $m }}
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of a component: gateway (pods running sluice serve) or control-plane. */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding admin-token and metrics-token. */}}
{{- define "sluice.secretName" -}}
{{- default (printf "%s-tokens" (include "sluice.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* The image of a Sluice container; gpu selects the NVML build. */}}
{{- define "sluice.image" -}}
{{- $repo := ternary .root.Values.image.gpuRepository .root.Values.image.repository .gpu }}
{{- $tag := default .root.Chart.AppVersion .root.Values.image.tag }}
{{- if .root.Values.image.digest }}
{{- printf "%s:%s@%s" $repo $tag .root.Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}
{{- end }}

{{/* The container security context: non-root, read-only root file system, nothing more. */}}
{{- define "sluice.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "sluice.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The tokens from the Secret, as the admin listener and /metrics read them. */}}
{{- define "sluice.tokenEnv" -}}
- name: SLUICE_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "sluice.secretName" . }}
      key: admin-token
- name: SLUICE_METRICS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "sluice.secretName" . }}
      key: metrics-token
{{- end }}

{{/* Ports and probes of a container running sluice serve. */}}
{{- define "sluice.servePorts" -}}
ports:
  - name: http
    containerPort: {{ .Values.ports.http }}
    protocol: TCP
  - name: admin
    containerPort: {{ .Values.ports.admin }}
    protocol: TCP
{{- end }}

{{- define "sluice.serveProbes" -}}
{{- $p := .Values.probes -}}
# Started once the process serves (/readyz would deadlock a sidecar,
# whose model server starts only after it).
startupProbe:
  httpGet: {path: /healthz, port: admin}
  periodSeconds: {{ $p.startup.periodSeconds }}
  timeoutSeconds: {{ $p.startup.timeoutSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
livenessProbe:
  httpGet: {path: /healthz, port: admin}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
readinessProbe:
  httpGet: {path: /readyz, port: admin}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
{{- end }}

{{/* Paths inside the pods. */}}
{{- define "sluice.configDir" -}}/etc/sluice/config{{- end }}
{{- define "sluice.tlsDir" -}}/etc/sluice/tls{{- end }}
{{- define "sluice.shadowDir" -}}/var/lib/sluice/shadow{{- end }}
{{- define "sluice.xdsDir" -}}/var/lib/sluice/xds{{- end }}

{{/* The control plane the mesh replicas follow: sluice xds, or another one. */}}
{{- define "sluice.xdsAddress" -}}
{{- $cp := .Values.mesh.controlPlane }}
{{- if $cp.enabled }}
{{- printf "%s-xds:%d" (include "sluice.fullname" .) (int $cp.port) }}
{{- else }}
{{- required "mesh.controlPlane.address (host:port) is required when mesh.controlPlane.enabled is false" $cp.address }}
{{- end }}
{{- end }}

{{/*
The Sluice config of sidecar and edge pods: .Values.config with the keys the chart owns set
from the other values (listeners on the container's ports, the tokens' variables, the TLS files
of the mounted Secret, trusted_proxies, the shadow store on its volume). Setting one of those
keys in config is an error that names the value to set instead.
*/}}
{{- define "sluice.config" -}}
{{- $c := deepCopy (.Values.config | default dict) }}
{{- range $key, $value := dict "listen" "ports.http" "tls" "tls.enabled and tls.secretName" "trusted_proxies" "trustedProxies" }}
{{- if hasKey $c $key }}
{{- fail (printf "config.%s is set by the chart: set %s instead" $key $value) }}
{{- end }}
{{- end }}
{{- $admin := deepCopy (get $c "admin" | default dict) }}
{{- range $key, $value := dict "listen" "ports.admin" "token_env" "auth (SLUICE_ADMIN_TOKEN from the Secret)" "metrics_token_env" "auth (SLUICE_METRICS_TOKEN from the Secret)" }}
{{- if hasKey $admin $key }}
{{- fail (printf "config.admin.%s is set by the chart: set %s instead" $key $value) }}
{{- end }}
{{- end }}
{{- $_ := set $c "listen" (printf "0.0.0.0:%d" (int .Values.ports.http)) }}
{{- $_ := set $admin "listen" (printf "0.0.0.0:%d" (int .Values.ports.admin)) }}
{{- $_ := set $admin "token_env" "SLUICE_ADMIN_TOKEN" }}
{{- $_ := set $admin "metrics_token_env" "SLUICE_METRICS_TOKEN" }}
{{- $_ := set $c "admin" $admin }}
{{- if .Values.tls.enabled }}
{{- $_ := set $c "tls" (dict "cert_file" (printf "%s/tls.crt" (include "sluice.tlsDir" .)) "key_file" (printf "%s/tls.key" (include "sluice.tlsDir" .))) }}
{{- end }}
{{- with .Values.trustedProxies }}
{{- $_ := set $c "trusted_proxies" . }}
{{- end }}
{{- if .Values.shadowStore.enabled }}
{{- $shadow := deepCopy (get $c "shadow" | default dict) }}
{{- if hasKey $shadow "store" }}
{{- fail "config.shadow.store is set by the chart: set shadowStore.enabled and shadowStore.volume instead" }}
{{- end }}
{{- $_ := set $shadow "store" (printf "%s/shadow.db" (include "sluice.shadowDir" .)) }}
{{- $_ := set $c "shadow" $shadow }}
{{- end }}
{{- toYaml $c }}
{{- end }}

{{/*
The bootstrap of mesh replicas: .Values.mesh.bootstrap (the replica's own settings: cluster,
sotw, tls to the control plane, load_signals) with the route configuration, the listeners,
listener TLS, metrics token and shadow store set by the chart. The server, node id and persisted config come from flags.
*/}}
{{- define "sluice.bootstrap" -}}
{{- $b := deepCopy (.Values.mesh.bootstrap | default dict) }}
{{- range $key, $value := dict "listen" "ports.http" "admin" "ports.admin" "listen_tls" "tls.enabled and tls.secretName" "shadow_store" "shadowStore" "server" "mesh.controlPlane (the --xds flag)" "node_id" "nothing (--node-id is the pod's name)" "persist" "mesh.persist (the --xds-persist flag)" "route_config" "mesh.controlPlane.routeConfig" "metrics_token_env" "auth (SLUICE_METRICS_TOKEN from the Secret)" }}
{{- if hasKey $b $key }}
{{- fail (printf "mesh.bootstrap.%s is set by the chart: set %s instead" $key $value) }}
{{- end }}
{{- end }}
{{- $_ := set $b "route_config" .Values.mesh.controlPlane.routeConfig }}
{{- $_ := set $b "listen" (printf "0.0.0.0:%d" (int .Values.ports.http)) }}
{{- $_ := set $b "admin" (printf "0.0.0.0:%d" (int .Values.ports.admin)) }}
{{- $_ := set $b "metrics_token_env" "SLUICE_METRICS_TOKEN" }}
{{- if .Values.tls.enabled }}
{{- $_ := set $b "listen_tls" (dict "cert_file" (printf "%s/tls.crt" (include "sluice.tlsDir" .)) "key_file" (printf "%s/tls.key" (include "sluice.tlsDir" .))) }}
{{- end }}
{{- if .Values.shadowStore.enabled }}
{{- $_ := set $b "shadow_store" (printf "%s/shadow.db" (include "sluice.shadowDir" .)) }}
{{- end }}
{{- toYaml $b }}
{{- end }}

{{/* Volumes shared by the gateway pods: config, /tmp, TLS, the shadow store. */}}
{{- define "sluice.gatewayVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ required "tls.secretName is required with tls.enabled (a Secret of type kubernetes.io/tls)" .Values.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- if .Values.shadowStore.enabled }}
{{- $s := .Values.shadowStore }}
- name: shadow
{{- if eq $s.volume "ephemeral" }}
  # One claim per pod, made and deleted with it: each replica writes its own SQLite file.
  ephemeral:
    volumeClaimTemplate:
      metadata:
        labels:
          {{- include "sluice.selectorLabels" (dict "root" . "component" "gateway") | nindent 10 }}
      spec:
        accessModes: ["ReadWriteOnce"]
        {{- with $s.storageClassName }}
        storageClassName: {{ . }}
        {{- end }}
        resources:
          requests:
            storage: {{ $s.size }}
{{- else if eq $s.volume "existingClaim" }}
  persistentVolumeClaim:
    claimName: {{ required "shadowStore.existingClaim is required with shadowStore.volume existingClaim" $s.existingClaim }}
{{- else if eq $s.volume "emptyDir" }}
  emptyDir:
    sizeLimit: {{ $s.size }}
{{- else }}
{{- fail (printf "shadowStore.volume: %q is not ephemeral, existingClaim or emptyDir" $s.volume) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sluice.gatewayVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ include "sluice.tlsDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.shadowStore.enabled }}
- name: shadow
  mountPath: {{ include "sluice.shadowDir" . }}
{{- end }}
{{- end }}

{{/* Spread over nodes and zones. */}}
{{- define "sluice.topologySpread" -}}
{{- $t := .root.Values.topologySpread }}
{{- if $t.enabled }}
topologySpreadConstraints:
{{- range $key := list "kubernetes.io/hostname" "topology.kubernetes.io/zone" }}
  - maxSkew: {{ $t.maxSkew }}
    topologyKey: {{ $key }}
    whenUnsatisfiable: {{ $t.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "sluice.selectorLabels" (dict "root" $.root "component" $.component) | nindent 8 }}
    matchLabelKeys: ["pod-template-hash"]
{{- end }}
{{- end }}
{{- end }}

{{/* Scheduling values every pod takes. */}}
{{- define "sluice.scheduling" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
