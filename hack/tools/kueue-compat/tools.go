//go:build tools

// Package tools pins sigs.k8s.io/kueue for hack/build-bins.sh.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
