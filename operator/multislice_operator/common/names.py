"""Names the operator derives for a job and the limits JobSet puts on them: one home for the rule,
read by the model's CRD (api/crd.py, at admission) and by the plan (validate and the operator).

JobSet v0.10.1's webhook (pkg/webhooks/jobset_webhook.go, ValidateCreate) refuses a JobSet unless
its subdomain (here: the job name) and its longest pod name,
`<jobset>-<replicatedJob>-<maxJobIndex>-<maxPodIndex>-abcde`, are DNS-1035 labels.
"""

from __future__ import annotations

import re

REPLICATED_JOB = "slice"  # the JobSet's one replicatedJob: one Job per slice
DNS_LABEL_MAX = 63
POD_NAME_SUFFIX = "-abcde"
DNS1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


PREFLIGHT_SUFFIX = "-preflight"


def preflight_job(name: str) -> str:
    """The compile Job of a job's spec.preflight: one deterministic name, so a pass after a crash
    finds the Job it created. A job name fits a pod name with 16 characters to spare
    (`max_name_length`), so `<name>-preflight-abcde` is a DNS label too."""
    return f"{name}{PREFLIGHT_SUFFIX}"


def longest_pod_name(name: str, slices: int, hosts: int) -> str:
    """The longest pod name JobSet will generate for this job (its webhook checks this one)."""
    return f"{name}-{REPLICATED_JOB}-{slices - 1}-{hosts - 1}{POD_NAME_SUFFIX}"


def max_name_length(slices: int, hosts: int) -> int:
    """The longest metadata.name a job of ``slices`` x ``hosts`` can have."""
    return DNS_LABEL_MAX - len(longest_pod_name("", slices, hosts))
