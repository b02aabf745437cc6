//go:build tools

// Package tools pins the newest lane's Kubernetes binaries built by hack/build-bins.sh --next:
// kube-apiserver and kube-scheduler only (the lane runs them beside the main lane's etcd,
// kube-controller-manager and kubectl, a supported version skew).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
