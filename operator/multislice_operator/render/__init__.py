"""The plan rendered: the JobSet and its pod template with the environment contract
(jobset), the Google identity the pods act as (identity), and whether the namespace's Pod
Security admits them (podsecurity)."""
