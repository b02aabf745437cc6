"""The commands, apart from the operator's flow: `multislice-operator` and `kubectl msj`
(main), the verbs that act on a cluster (verbs), the status view (view)."""
