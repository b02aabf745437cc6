{{/* What values.schema.json cannot say, since a JSON schema compares no two values: rules
across values, failed at render (`helm template`, `helm install`, Argo CD) before any object is
sent. Included once, by deployment.yaml. */}}
{{- define "multislice-operator.validate" -}}
{{- $v := .Values }}
{{- $metricsOn := ne (int $v.metrics.port) 0 }}
{{- /* One listener per port: the second never binds and the pod crash-loops. */}}
{{- if and $metricsOn (eq (int $v.health.port) (int $v.metrics.port)) }}
{{- fail (printf "health.port (%d) is metrics.port: the two endpoints need a port each" (int $v.health.port)) }}
{{- end }}
{{- /* metrics.port 0 turns the endpoint off (MSJ_METRICS_PORT=0): nothing may scrape it. */}}
{{- if not $metricsOn }}
{{- range $name, $enabled := dict "serviceMonitor" $v.metrics.serviceMonitor.enabled "podMonitoring" $v.metrics.podMonitoring.enabled "prometheusRule" $v.metrics.prometheusRule.enabled }}
{{- if $enabled }}
{{- fail (printf "metrics.port is 0 (metrics off): metrics.%s.enabled needs the endpoint" $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* Prometheus and GMP refuse a scrape timeout longer than its interval. */}}
{{- with $v.metrics.serviceMonitor }}
{{- if and .enabled (gt (include "multislice-operator.millis" .scrapeTimeout | int64) (include "multislice-operator.millis" .interval | int64)) }}
{{- fail (printf "metrics.serviceMonitor.scrapeTimeout (%s) is longer than its interval (%s)" .scrapeTimeout .interval) }}
{{- end }}
{{- end }}
{{- with $v.metrics.podMonitoring }}
{{- if and .enabled .timeout (gt (include "multislice-operator.millis" .timeout | int64) (include "multislice-operator.millis" .interval | int64)) }}
{{- fail (printf "metrics.podMonitoring.timeout (%s) is longer than its interval (%s)" .timeout .interval) }}
{{- end }}
{{- end }}
{{- /* A budget that allows no eviction makes every drain of the operator's node hang. The
disruptions it allows: replicas - minAvailable (a percentage rounded up, as the disruption
controller does), or maxUnavailable (rounded up). */}}
{{- with $v.podDisruptionBudget }}
{{- $replicas := int $v.replicaCount }}
{{- if and .enabled (gt $replicas 0) }}
{{- $allowed := 0 }}
{{- if hasKey . "minAvailable" }}
{{- $min := include "multislice-operator.scaled" (list .minAvailable $replicas) | int }}
{{- $allowed = sub $replicas $min }}
{{- else }}
{{- $allowed = include "multislice-operator.scaled" (list .maxUnavailable $replicas) | int }}
{{- end }}
{{- if le (int $allowed) 0 }}
{{- fail (printf "podDisruptionBudget (%s) never allows an eviction of %d replica(s): every drain of the operator's node would hang; lower it or raise replicaCount" (ternary (printf "minAvailable: %v" .minAvailable) (printf "maxUnavailable: %v" .maxUnavailable) (hasKey . "minAvailable")) $replicas) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* An agent image for an in-place restart that is turned off would be silently unused. */}}
{{- if and (not $v.inPlaceRestart.enabled) $v.inPlaceRestart.agentImage }}
{{- fail (printf "inPlaceRestart.agentImage (%s) is set but inPlaceRestart.enabled is false: remove the image, or set enabled: true" $v.inPlaceRestart.agentImage) }}
{{- end }}
{{- /* MultiKueue: a role, and what each role's objects need. */}}
{{- with $v.multikueue }}
{{- if not (has .role (list "" "manager" "worker")) }}
{{- fail (printf "multikueue.role (%q) is not a role: set \"manager\" (the cluster MultiKueue dispatches from), \"worker\" (a cluster that runs the jobs) or \"\" (no MultiKueue)" (toString .role)) }}
{{- end }}
{{- if and .role (not $v.kueue.enabled) }}
{{- fail (printf "multikueue.role is %q but kueue.enabled is false: MultiKueue is Kueue's; set kueue.enabled: true (the operator's --kueue) or multikueue.role: \"\"" .role) }}
{{- end }}
{{- if and (eq .role "manager") .manager.create }}
{{- if not .manager.workers }}
{{- fail "multikueue.manager.create is true but multikueue.manager.workers is empty: a MultiKueueConfig lists 1 to 20 clusters; add {name, kubeconfigSecret} for each worker or set multikueue.manager.create: false" }}
{{- end }}
{{- $seen := list }}
{{- range .manager.workers }}
{{- if has .name $seen }}
{{- fail (printf "multikueue.manager.workers names %q twice: one MultiKueueCluster per worker, each name once" .name) }}
{{- end }}
{{- $seen = append $seen .name }}
{{- end }}
{{- if and $v.kueue.admissionCheck.create (eq .manager.admissionCheckName $v.kueue.admissionCheck.name) }}
{{- fail (printf "multikueue.manager.admissionCheckName and kueue.admissionCheck.name are both %q: the two AdmissionChecks need a name each" .manager.admissionCheckName) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* A Prometheus duration (1m30s, 500ms; values.schema.json's pattern) in milliseconds. */}}
{{- define "multislice-operator.millis" -}}
{{- $unit := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 }}
{{- $total := 0 }}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" (toString .) -1 }}
{{- $n := regexFind "^[0-9]+" . }}
{{- $total = add $total (mul (int64 $n) (index $unit (trimPrefix $n .))) }}
{{- end }}
{{- $total }}
{{- end }}

{{/* An int-or-percent of a PodDisruptionBudget scaled to the replicas: a percentage rounds up,
as Kubernetes' GetScaledValueFromIntOrPercent(..., true). Argument: (list value replicas). */}}
{{- define "multislice-operator.scaled" -}}
{{- $value := index . 0 }}
{{- $replicas := index . 1 }}
{{- if kindIs "string" $value }}
{{- $pct := trimSuffix "%" $value | int }}
{{- div (add (mul $replicas $pct) 99) 100 }}
{{- else }}
{{- int $value }}
{{- end }}
{{- end }}
