//go:build tools

// Package tools pins helm.sh/helm/v3 for hack/build-bins.sh.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
