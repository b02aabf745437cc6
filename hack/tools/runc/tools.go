//go:build tools

// Package tools pins runc for hack/build-bins.sh (the real-node lane's OCI runtime).
package tools

import (
	_ "github.com/opencontainers/runc"
)
