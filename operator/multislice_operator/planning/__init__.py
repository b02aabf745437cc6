"""Plan = f(spec): slices, hosts, node pools and layout (plan), with the DCN
advisor and the check that the template's node selection can match the job's own pools
(placement)."""
