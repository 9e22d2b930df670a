{{/* The image, as repository:tag. */}}
{{- define "leasehold.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/* Labels of every object of a component: name, instance, component. */}}
{{- define "leasehold.labels" -}}
app.kubernetes.io/name: leasehold
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{/* The labels a component's selectors match (a subset of its labels). */}}
{{- define "leasehold.selector" -}}
app.kubernetes.io/name: leasehold
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Member ids 1..replicas, comma-separated. */}}
{{- define "leasehold.memberIds" -}}
{{- $ids := list -}}
{{- range $i := until (int .Values.members.replicas) -}}
{{- $ids = append $ids (add1 $i) -}}
{{- end -}}
{{ join "," $ids }}
{{- end }}

{{/* Every member's gRPC address, comma-separated. */}}
{{- define "leasehold.memberAddrs" -}}
{{- $addrs := list -}}
{{- range $i := until (int .Values.members.replicas) -}}
{{- $addrs = append $addrs (printf "%s-%d.%s:%d" $.Release.Name $i $.Release.Name (int $.Values.members.grpcPort)) -}}
{{- end -}}
{{ join "," $addrs }}
{{- end }}

{{/* The pod and container security settings every workload shares. */}}
{{- define "leasehold.podSecurity" -}}
securityContext: { runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, fsGroup: 65532, seccompProfile: { type: RuntimeDefault } }
automountServiceAccountToken: false
{{- end }}
{{- define "leasehold.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: { drop: ["ALL"] }
{{- end }}

{{/*
The `certs` volume of a workload: the Secret made beforehand, or with
cert-manager a projection of its Secrets under the file names the
arguments read. Takes root, secret (the Secret's name), and files: a list
of [cert-manager Secret, file stem] pairs, the first also giving ca.pem.
*/}}
{{- define "leasehold.certsVolume" -}}
- name: certs
{{- if eq .root.Values.tls.source "cert-manager" }}
  projected:
    defaultMode: 0440
    sources:
{{- range $i, $pair := .files }}
      - secret:
          name: {{ index $pair 0 }}
          items:
{{- if eq $i 0 }}
            - { key: ca.crt, path: ca.pem }
{{- end }}
            - { key: tls.crt, path: {{ index $pair 1 }}.pem }
            - { key: tls.key, path: {{ index $pair 1 }}.key }
{{- end }}
{{- else if eq .root.Values.tls.source "secrets" }}
  secret: { secretName: {{ .secret }}, defaultMode: 0440 }
{{- else }}
{{- fail (printf "tls.source must be \"secrets\" or \"cert-manager\", not %q" .root.Values.tls.source) }}
{{- end }}
{{- end }}

{{/* Secret names with source "secrets". */}}
{{- define "leasehold.memberSecret" -}}
{{ default (printf "%s-member-certs" .Release.Name) .Values.tls.memberSecret }}
{{- end }}
{{- define "leasehold.operatorSecret" -}}
{{ default (printf "%s-operator-certs" .Release.Name) .Values.tls.operatorSecret }}
{{- end }}
{{- define "leasehold.escrowSecret" -}}
{{ default (printf "%s-escrow-" .root.Release.Name) .root.Values.tls.escrowSecretPrefix }}{{ .region }}-certs
{{- end }}

{{/* The operator certificate's volume (init Job, backup CronJob). */}}
{{- define "leasehold.operatorCerts" -}}
{{ include "leasehold.certsVolume" (dict "root" . "secret" (include "leasehold.operatorSecret" .) "files" (list (list (printf "%s-operator-admin-tls" .Release.Name) "operator-admin"))) }}
{{- end }}

{{/* TLS flags of an operator command reading /certs. */}}
{{- define "leasehold.operatorTlsArgs" -}}
"--tls-ca", "/certs/ca.pem", "--tls-cert", "/certs/operator-admin.pem", "--tls-key", "/certs/operator-admin.key"
{{- end }}
