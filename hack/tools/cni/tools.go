//go:build tools

// Package tools pins the CNI plugins for hack/build-bins.sh (the real-node lane's pod network).
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
)
