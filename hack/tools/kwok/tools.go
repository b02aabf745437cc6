//go:build tools

// Package tools pins sigs.k8s.io/kwok for hack/build-bins.sh.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
	_ "sigs.k8s.io/kwok/cmd/kwokctl"
)
