{{- define "dpsynth.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dpsynth.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "dpsynth.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "dpsynth.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dpsynth.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ include "dpsynth.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* selector labels of one component: include "dpsynth.selector" (list . "mlflow") */}}
{{- define "dpsynth.selector" -}}
app.kubernetes.io/name: {{ include "dpsynth.name" (index . 0) }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "dpsynth.stageNamespace" -}}
{{- default .Release.Namespace .Values.stage.namespace -}}
{{- end -}}

{{- define "dpsynth.credentialsSecret" -}}
{{- default (printf "%s-credentials" (include "dpsynth.fullname" .)) .Values.credentials.existingSecret -}}
{{- end -}}

{{- define "dpsynth.stageSecret" -}}
{{- default (printf "%s-stage" (include "dpsynth.fullname" .)) .Values.stage.existingSecret -}}
{{- end -}}

{{- define "dpsynth.ledgerAdminSecret" -}}
{{- default (printf "%s-ledger-admin" (include "dpsynth.fullname" .)) .Values.ledger.adminSecret -}}
{{- end -}}

{{/* The ledger's SQLAlchemy URL as one role: include "dpsynth.ledgerUrl" (list . USER PASSWORD), PASSWORD as it is
     to appear (URL-quoted, or a $(VAR) Kubernetes expands). */}}
{{- define "dpsynth.ledgerUrl" -}}
{{- $ := index . 0 -}}
{{- printf "postgresql+psycopg2://%s:%s@%s:%s/%s" (index . 1) (index . 2) (include "dpsynth.postgresHost" $) (include "dpsynth.postgresPort" $) $.Values.ledger.database -}}
{{- end -}}

{{- define "dpsynth.stageConfigMap" -}}
{{- printf "%s-stage-config" (include "dpsynth.fullname" .) -}}
{{- end -}}

{{- define "dpsynth.airflowServiceAccount" -}}
{{- default (printf "%s-airflow" (include "dpsynth.fullname" .)) .Values.airflow.serviceAccount.name -}}
{{- end -}}

{{- define "dpsynth.s3Endpoint" -}}
{{- if .Values.minio.enabled -}}
{{- printf "http://%s-minio.%s.svc:9000" (include "dpsynth.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.s3.endpoint -}}
{{- end -}}
{{- end -}}

{{- define "dpsynth.postgresHost" -}}
{{- if .Values.postgresql.enabled -}}
{{- printf "%s-postgresql.%s.svc" (include "dpsynth.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- required "postgresql.external.host is required when postgresql.enabled=false" .Values.postgresql.external.host -}}
{{- end -}}
{{- end -}}

{{- define "dpsynth.postgresPort" -}}
{{- if .Values.postgresql.enabled }}5432{{ else }}{{ .Values.postgresql.external.port }}{{ end -}}
{{- end -}}

{{- define "dpsynth.mlflowUrl" -}}
{{- printf "http://%s-mlflow.%s.svc:%v" (include "dpsynth.fullname" .) .Release.Namespace .Values.mlflow.port -}}
{{- end -}}

{{/* The Host headers MLflow's server accepts (MLflow 3 refuses any other with 403 "Invalid Host header",
     answering only /health): its Service under every name a pod resolves (with and without the port),
     localhost for `kubectl port-forward`, mlflow.ingressHost and mlflow.allowedHosts. Comma-separated. */}}
{{- define "dpsynth.mlflowAllowedHosts" -}}
{{- $name := printf "%s-mlflow" (include "dpsynth.fullname" .) -}}
{{- $ns := .Release.Namespace -}}
{{- $hosts := list -}}
{{- range (list $name (printf "%s.%s" $name $ns) (printf "%s.%s.svc" $name $ns) (printf "%s.%s.svc.%s" $name $ns .Values.clusterDomain) "localhost" "127.0.0.1") -}}
{{- $hosts = concat $hosts (list . (printf "%s:%v" . $.Values.mlflow.port)) -}}
{{- end -}}
{{- $hosts = concat $hosts (list "localhost:*" "127.0.0.1:*") -}}
{{- with .Values.mlflow.ingressHost }}{{ $hosts = append $hosts . }}{{ end -}}
{{- $hosts = concat $hosts .Values.mlflow.allowedHosts -}}
{{- join "," (uniq $hosts) -}}
{{- end -}}

{{/* A dpsynth image, imageRegistry/repository:tag: include "dpsynth.image" (list . .Values.stage.image) */}}
{{- define "dpsynth.image" -}}
{{- $ := index . 0 -}}
{{- $image := index . 1 -}}
{{- with $.Values.imageRegistry }}{{ trimSuffix "/" . }}/{{ end }}{{ $image.repository }}:{{ $image.tag }}
{{- end -}}

{{/* imagePullSecrets of a pod spec (nothing when none are set): include "dpsynth.pullSecrets" . | nindent N */}}
{{- define "dpsynth.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "dpsynth.partitionKeySecret" -}}
{{- default (printf "%s-partition-key" (include "dpsynth.fullname" .)) .Values.partitionKey.secret -}}
{{- end -}}

{{- define "dpsynth.mlflowAuthSecret" -}}
{{- default (printf "%s-mlflow-auth" (include "dpsynth.fullname" .)) .Values.mlflow.auth.secret -}}
{{- end -}}

{{- define "dpsynth.mlflowS3Secret" -}}
{{- default (printf "%s-mlflow-s3" (include "dpsynth.fullname" .)) .Values.mlflow.s3Secret -}}
{{- end -}}

{{- define "dpsynth.airflowMetadataSecret" -}}
{{- default (printf "%s-airflow-metadata" (include "dpsynth.fullname" .)) .Values.airflow.metadataSecret -}}
{{- end -}}

{{/* The bucket of mlflow.artifactRoot (s3://BUCKET/prefix): the only one MLflow's object-store key may use. */}}
{{- define "dpsynth.mlflowBucket" -}}
{{- index (splitList "/" (trimPrefix "s3://" .Values.mlflow.artifactRoot)) 0 -}}
{{- end -}}

{{/* A stage image pod's securityContext under PodSecurity "restricted" (the stage images' uid 10001). */}}
{{- define "dpsynth.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
seccompProfile: {type: RuntimeDefault}
{{- end -}}
