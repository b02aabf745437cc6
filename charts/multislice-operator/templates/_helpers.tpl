{{/* Names, labels and the leader-election switch shared by every template. */}}

{{- define "multislice-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "multislice-operator.fullname" -}}
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

{{- define "multislice-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "multislice-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "multislice-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end }}

{{- define "multislice-operator.labels" -}}
helm.sh/chart: {{ include "multislice-operator.chart" . }}
{{ include "multislice-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The operator's ServiceAccount. With serviceAccount.create false it must be named: binding
the namespace's `default` account would hand the operator's grants to every pod that runs as it. */}}
{{- define "multislice-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "multislice-operator.fullname" .) .Values.serviceAccount.name }}
{{- else if and .Values.serviceAccount.name (ne .Values.serviceAccount.name "default") }}
{{- .Values.serviceAccount.name }}
{{- else }}
{{- fail "serviceAccount.create is false: set serviceAccount.name to the operator's own ServiceAccount (not \"default\": every pod of the namespace without one runs as it)" }}
{{- end }}
{{- end }}

{{/* The admission policies (templates/admissionpolicy.yaml): asked for, and served by the
cluster (admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy, GA in Kubernetes 1.30). Helm
lists kinds only when it asks a cluster; `helm template` knows the --kube-version alone. */}}
{{- define "multislice-operator.admissionPolicy" -}}
{{- $served := or (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version) }}
{{- if and .Values.rbac.admissionPolicy.enabled $served }}true{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when image.digest is set (the digest names the
bytes; the tag is then ignored). */}}
{{- define "multislice-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The in-place restart agent's image (inPlaceRestart.agentImage, else the operator's own, which
carries the agent); empty when inPlaceRestart.enabled is false. */}}
{{- define "multislice-operator.agentImage" -}}
{{- if .Values.inPlaceRestart.enabled }}
{{- default (include "multislice-operator.image" .) .Values.inPlaceRestart.agentImage }}
{{- end }}
{{- end }}

{{/* What the operator does to namespaced objects (templates/rbac.yaml): in the ClusterRole, or
in one Role per watched namespace. */}}
{{- define "multislice-operator.namespacedRules" -}}
{{- if .Values.inPlaceRestart.enabled }}
# In-place restart: the agents' ServiceAccount and its RoleBinding to the ClusterRole
# multislice-inplace-restart (templates/inplace-restart.yaml), server-side applied in each job
# namespace before the job's JobSet (an apply that creates the object needs create too); `bind`
# on that ClusterRole only.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["clusterroles"]
  verbs: ["bind"]
  resourceNames: ["multislice-inplace-restart"]
{{- end }}
# Jobs: kopf lists and watches them; the operator patches its own finalizer on and off
# (Managed jobs, before the first node pool); ttlSecondsAfterFinished deletes them; the orphan
# sweep lists them.
- apiGroups: ["multislice.dev"]
  resources: ["multislicejobs"]
  verbs: ["list", "watch", "patch", "delete"]
# The status is the operator's only memory and its only write to a job besides metadata.
- apiGroups: ["multislice.dev"]
  resources: ["multislicejobs/status"]
  verbs: ["patch"]
# The JobSet's owner reference sets blockOwnerDeletion, which clusters running the
# OwnerReferencesPermissionEnforcement admission plugin allow only with this.
- apiGroups: ["multislice.dev"]
  resources: ["multislicejobs/finalizers"]
  verbs: ["update"]
# One JobSet per job: dry-run and created, read back on a name conflict, suspended/resumed by
# patch, deleted when the job fails for a reason of the operator's while it runs (its pods must
# not wait for released capacity; a spent maxDisruptionRestarts, which JobSet would restart
# forever). Otherwise the garbage collector deletes it (owner reference). The admission policy
# (rbac.admissionPolicy) allows only a MultisliceJob's JobSet, outside the system namespaces.
- apiGroups: ["jobset.x-k8s.io"]
  resources: ["jobsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Kubernetes 1.37 gang scheduling, where scheduling.k8s.io/v1beta1 PodGroups are served: one
# PodGroup per job, server-side applied (create and patch) before its JobSet, whose pods name it;
# the garbage collector deletes it with the job (owner reference).
- apiGroups: ["scheduling.k8s.io"]
  resources: ["podgroups"]
  verbs: ["create", "patch"]
# GKE dynamic slicing (provisioning.mode DynamicSlicing, Ironwood): one Slice per slice of such a
# job, created from its cubes and deleted when the job ends or the Slice breaks. Cluster-scoped.
# patch: a deleted Slice stuck past dynamicSlicing.sliceDeletionTimeoutSeconds loses its finalizer.
- apiGroups: ["accelerator.gke.io"]
  resources: ["slices"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Jobs are created as a server-side dry run (?dryRun=All, nothing is stored): the apiserver's
# verdict on the pod template before any node pool exists; and, for spec.preflight, the job's
# compile Job, read back (get) and deleted once it finished. RBAC cannot say which Jobs; the
# admission policy (rbac.admissionPolicy) refuses any other create or delete.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "get", "delete"]
# The job's pods: indexed (failures, exit codes, the scheduler's verdict); a checkpoint request
# is an annotation on each (metadata only, by merge patch); the startup deadline evicts the pods
# that never ran. RBAC cannot say which pods nor which fields: the admission policy
# (rbac.admissionPolicy) limits the patch to the multislice.dev/ annotations and both verbs to
# the pods of a MultisliceJob.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch"]
- apiGroups: [""]
  resources: ["pods/eviction"]
  verbs: ["create"]
# Events on the job (what `kubectl describe msj` shows); a repeat updates the first one's
# count and last timestamp (patch), as client-go's event recorder does.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.kueue.enabled }}
# Kueue (--kueue): each queued job's Workload is the operator's to create (owned by the job)
# and watched with the LocalQueue it names (its ClusterQueue and pending count); the operator
# writes its check's state and the owner's conditions (quota released after an eviction,
# Finished) on a Workload's status, spec.active when the job is suspended or resumed, and reads
# the WorkloadPriorityClass a job names (its value is the Workload's priority).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads", "localqueues"]
  verbs: ["list", "watch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloadpriorityclasses"]
  verbs: ["get"]
{{- end }}
{{- end }}
