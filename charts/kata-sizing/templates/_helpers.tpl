{{/* The objects' base name: the release name when it already says kata-sizing. */}}
{{- define "kata-sizing.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kata-sizing.serviceAccountName" -}}
{{- default (include "kata-sizing.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* Labels on every object: manifests/' one label, plus Helm's. */}}
{{- define "kata-sizing.labels" -}}
app.kubernetes.io/name: kata-sizing
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The operator pod's labels; the Deployment and both Services select on these. */}}
{{- define "kata-sizing.selectorLabels" -}}
app.kubernetes.io/name: kata-sizing
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kata-sizing.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "kata-sizing.webhookService" -}}
{{- printf "%s-webhook" (include "kata-sizing.fullname" .) -}}
{{- end -}}

{{- define "kata-sizing.webhookSecret" -}}
{{- if .Values.webhook.certManager.enabled -}}
{{- printf "%s-webhook-tls" (include "kata-sizing.fullname" .) -}}
{{- else -}}
{{- required "webhook.tlsSecretName is required when webhook.certManager.enabled is false" .Values.webhook.tlsSecretName -}}
{{- end -}}
{{- end -}}

{{/*
The shared admission policies the chart creates (templates/admission-policies.yaml says why and
how), as YAML documents: each of files/admission-policies.yaml whose kind the API server serves.
*/}}
{{- define "kata-sizing.sharedAdmissionPolicies" -}}
{{- $servedFrom := dict "ValidatingAdmissionPolicy" ">=1.30.0-0" "ValidatingAdmissionPolicyBinding" ">=1.30.0-0" "MutatingAdmissionPolicy" ">=1.36.0-0" "MutatingAdmissionPolicyBinding" ">=1.36.0-0" }}
{{- if .Values.admissionPolicies.create }}
{{- range $document := regexSplit "(?m)^---\\s*$" (.Files.Get "files/admission-policies.yaml") -1 }}
{{- $object := fromYaml $document }}
{{- if $object.kind }}
{{- if or ($.Capabilities.APIVersions.Has (printf "%s/%s" $object.apiVersion $object.kind)) (semverCompare (get $servedFrom $object.kind) $.Capabilities.KubeVersion.Version) }}
---
{{ trim $document }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
