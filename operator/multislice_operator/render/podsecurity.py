"""Would the namespace's Pod Security admission refuse the job's pods? Pure: the namespace's
labels and the rendered pod spec in, the refusal (naming the label, its level and the fix) out.

Pod Security admission enforces on pods only (a Job or JobSet with a refused template is
admitted, then its controller can create no pod), so neither the JobSet's nor the probe Job's dry
run sees it; without this a Managed job would provision every slice and fail PodsNotCreated after
unschedulableTimeoutSeconds.

Rules (k8s.io/pod-security-admission v0.34, api/helpers.go and policy/check_hostNamespaces.go):
the level is the ``pod-security.kubernetes.io/enforce`` label (privileged, baseline, restricted;
any other value is enforced as restricted); the "hostNamespaces" check of baseline and restricted
(every version) refuses hostNetwork, hostPID and hostIPC true. Cluster-wide defaults and
exemptions (the AdmissionConfiguration) are not visible from the namespace: without the label
nothing is concluded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from multislice_operator.common.keys import POD_SECURITY_ENFORCE

PRIVILEGED, BASELINE, RESTRICTED = "privileged", "baseline", "restricted"
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")


def enforced_level(labels: Mapping[str, str]) -> str | None:
    """The level the namespace enforces by its label; None without the label."""
    value = labels.get(POD_SECURITY_ENFORCE)
    if value is None:
        return None
    return value if value in (PRIVILEGED, BASELINE, RESTRICTED) else RESTRICTED


def refusal(namespace: str, labels: Mapping[str, str], pod: Mapping[str, Any]) -> str | None:
    """Why Pod Security would refuse every pod of the job (a rendered pod spec), or None."""
    level = enforced_level(labels)
    if level in (None, PRIVILEGED):
        return None
    shared = [f"{f}: true" for f in HOST_NAMESPACES if pod.get(f)]
    if not shared:
        return None
    value = labels[POD_SECURITY_ENFORCE]
    unknown = "" if value == level else f" (an unknown level is enforced as {RESTRICTED})"
    return (
        f"namespace {namespace} enforces Pod Security level {level} (label "
        f"{POD_SECURITY_ENFORCE}={value}{unknown}), which refuses pods with "
        f"{', '.join(shared)}: the Job controller could create none of the job's pods"
        + (
            " (they run on the host network by default: DCN traffic goes over the hosts' NICs)"
            if "hostNetwork: true" in shared
            else ""
        )
        + f". Fix: allow it in the namespace (kubectl label namespace {namespace} "
        f"{POD_SECURITY_ENFORCE}={PRIVILEGED} --overwrite), run the job in a namespace that does, "
        "or set spec.template.spec.hostNetwork: false"
    )
