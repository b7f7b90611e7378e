// Package deploy holds the test of nri-gpu's deployment files (Kubernetes
// manifests, the Helm chart). It is a module of its own so that
// k8s.io/api stays out of the product's module.
package deploy
