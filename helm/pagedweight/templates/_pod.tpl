{{/*
What every PagedWeight pod has: the node file, the control keys, the model, a writable run
directory; the flags every process gets.
*/}}

{{/* The flags after the binary: the node file, the section, the control keys. (dict "ctx" $ "section" "router") */}}
{{- define "pagedweight.processArgs" -}}
- --config
- /etc/pagedweight/cluster.yaml
- --section
- {{ .section }}
{{- if .ctx.Values.controlPlane.insecure }}
- --insecure
{{- else }}
- --control-keys
- /run/pagedweight/keys/control.keys
{{- end }}
{{- end }}

{{- define "pagedweight.volumeMounts" -}}
- name: config
  mountPath: /etc/pagedweight
  readOnly: true
{{- if not .Values.controlPlane.insecure }}
- name: keys
  mountPath: /run/pagedweight/keys
  readOnly: true
{{- end }}
- name: run
  mountPath: /home/pw/run
{{- if ne .Values.model.storage "image" }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "pagedweight.volumes" -}}
- name: config
  configMap:
    name: {{ include "pagedweight.fullname" . }}-config
{{- if not .Values.controlPlane.insecure }}
- name: keys-secret
  secret:
    secretName: {{ include "pagedweight.controlKeysSecret" . }}
    optional: false  # the default, said: podman 4.3's kube play crashes without it
    defaultMode: 0440
    items:
      - key: control.keys
        path: control.keys
- name: keys
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
- name: run
  emptyDir:
    sizeLimit: 1Gi
{{- if eq .Values.model.storage "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ default (printf "%s-model" (include "pagedweight.fullname" .)) .Values.model.pvc.existingClaim }}
    readOnly: true
{{- else if eq .Values.model.storage "hostPath" }}
- name: model
  hostPath:
    path: {{ .Values.model.hostPath.path }}
    type: Directory
{{- end }}
{{- end }}

{{/*
Init containers: the control keys copied to a file the process owns with mode 0600 (the
processes refuse a key file that others can read or another user owns, and a Secret volume's
files belong to root); with a store built by the Job, a wait until it is there. (dict "ctx" $ "store" bool)
*/}}
{{- define "pagedweight.initContainers" -}}
{{- $v := .ctx.Values }}
{{- if not $v.controlPlane.insecure }}
- name: control-keys
  image: {{ include "pagedweight.image" .ctx }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command: [install, -m, "0600", /run/pagedweight/secret/control.keys, /run/pagedweight/keys/control.keys]
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {memory: 32Mi}
  volumeMounts:
    - name: keys-secret
      mountPath: /run/pagedweight/secret
      readOnly: true
    - name: keys
      mountPath: /run/pagedweight/keys
{{- end }}
{{- if and .store $v.model.store.build }}
- name: wait-store
  image: {{ include "pagedweight.image" .ctx }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command: [bash, -c, 'until [ -f "$0" ]; do echo "waiting for the store $0 (Job {{ include "pagedweight.fullname" .ctx }}-store)"; sleep 5; done', {{ include "pagedweight.storePath" .ctx | quote }}]
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {memory: 32Mi}
  volumeMounts:
    - name: model
      mountPath: {{ $v.model.mountPath }}
      readOnly: true
{{- end }}
{{- end }}

{{/* The environment of a worker: its pod name is its id, its pod IP the address its UCX
listeners use (--advertise-host), its node the one it registers on (--node: placement pairs a
prefill and a decode worker of one node). */}}
{{- define "pagedweight.workerEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end }}

{{/* The flags that name a worker, its address and its node (pagedweight.workerEnv). */}}
{{- define "pagedweight.workerIdentityArgs" -}}
- --id
- $(POD_NAME)
- --advertise-host
- $(POD_IP)
- --node
- $(NODE_NAME)
{{- end }}

{{/* The pod-level settings every role has. (dict "ctx" $ "role" .Values.router) */}}
{{- define "pagedweight.podScheduling" -}}
{{- with .role.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .role.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .role.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .role.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
