"""The in-tree plugins: three capacity models and three restart strategies, each registered the
way a plugin written outside the package is (registry.py `BUILTIN`, `module:register`).

Capacity models: ``nodepools`` (Managed: a GKE node pool per slice, gang provisioning, repair,
spares, flex-start, elastic sizing), ``existing`` (Existing: node pools that are there),
``dynamic`` (DynamicSlicing: GKE Slices over Ironwood 4x4x4 cubes). Restart strategies:
``recreate`` (JobSet's Recreate), ``inplace`` (JobSet's InPlaceRestart), ``resize`` (the JobSet
recreated on another slice count: spec.elastic). A plugin module holds decide()'s half and its
`register`, which names its other parts where their layer keeps them (observation: controller/,
placement: render/, planning: planning/); tests/plugins/ holds two written outside the package.
"""
