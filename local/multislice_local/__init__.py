"""The local default: real control-plane processes built from Go modules, kwok fake TPU nodes, the
GKE API simulator and the narrated demo. Development and test tooling, kept out of the operator
package and its image."""
