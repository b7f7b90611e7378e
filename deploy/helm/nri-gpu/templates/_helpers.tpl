{{/*
Names and labels as NVIDIA's and most charts make them: the chart's name
(nameOverride), and the objects' name from the release's (fullnameOverride;
a release named nri-gpu gives the objects of deploy/kubernetes).
*/}}
{{- define "nri-gpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nri-gpu.fullname" -}}
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

{{/* The selector: the name and the release, so that two releases never select each other's pods. */}}
{{- define "nri-gpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nri-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nri-gpu.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "nri-gpu.labels" -}}
{{ include "nri-gpu.commonLabels" . }}
{{ include "nri-gpu.selectorLabels" . }}
{{- end }}

{{/* The MPS daemons' DaemonSet: its own name label, so that nri-gpu's selector never counts its pods. */}}
{{- define "nri-gpu.mpsSelectorLabels" -}}
app.kubernetes.io/name: {{ include "nri-gpu.name" . }}-mps
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nri-gpu.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
nri-gpu.devicePluginOn: "true" when nri-gpu's device plugin runs. The DRA
driver turns it off (a GPU is offered by one allocator), as
deploy/kubernetes-dra does, unless both are given devices lists
(disjoint; nri-gpu checks that at start). One list without the other
fails here: nri-gpu would refuse the configuration on every node.
*/}}
{{- define "nri-gpu.devicePluginOn" -}}
{{- $c := .Values.config }}
{{- if not $c.devicePlugin.enabled }}false
{{- else if not $c.dra.enabled }}true
{{- else if and $c.devicePlugin.devices $c.dra.devices }}true
{{- else if or $c.devicePlugin.devices $c.dra.devices }}
{{- fail "config.dra.enabled with config.devicePlugin.enabled: give both config.devicePlugin.devices and config.dra.devices (disjoint: a GPU is offered by one allocator), or neither (the DRA driver then takes every GPU and the device plugin is off)" }}
{{- else }}false
{{- end }}
{{- end }}

{{/*
nri-gpu.dynamicMIGOn: "true" when config.dra.dynamicMIG.devices names
GPUs: MIG devices made on demand, the one switch that adds capabilities
(SYS_ADMIN, MKNOD) and a writable host mount (/dev/nvidia-caps) to
nri-gpu's pod. Without config.dra.enabled it fails here: nri-gpu would
refuse the configuration on every node.
*/}}
{{- define "nri-gpu.dynamicMIGOn" -}}
{{- if dig "dynamicMIG" "devices" list .Values.config.dra }}
{{- if not .Values.config.dra.enabled }}
{{- fail "config.dra.dynamicMIG.devices needs config.dra.enabled: MIG devices are made on demand by nri-gpu's DRA driver only" }}
{{- end }}true
{{- else }}false
{{- end }}
{{- end }}

{{/* nri-gpu's configuration as rendered into the ConfigMap: .Values.config with the device plugin as nri-gpu.devicePluginOn says. */}}
{{- define "nri-gpu.config" -}}
{{- $c := deepCopy .Values.config }}
{{- $_ := set $c.devicePlugin "enabled" (eq (include "nri-gpu.devicePluginOn" .) "true") }}
{{- toYaml $c }}
{{- end }}
