// Command coredns is upstream CoreDNS (github.com/coredns/coredns, pinned in go.mod) with only
// the plugins the local real-node stack uses compiled in: the cluster DNS of
// local/multislice_local/realnodes.py. Upstream's own main (coredns.go) imports every plugin
// (route53, azure, clouddns, etcd, ...); a main that imports a few and sets the directive order
// is CoreDNS's documented way to build with a chosen plugin set.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins above, in upstream's order (core/dnsserver/zdirectives.go).
var directives = []string{"bind", "ready", "errors", "kubernetes"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
