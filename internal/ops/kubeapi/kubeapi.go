// Package kubeapi is how nri-gpu reaches the Kubernetes API server, for
// the DRA driver and the pods' Events: the client configuration (a
// kubeconfig file, else the pod's service account) and the Kubernetes
// libraries' logs sent to nri-gpu's logger.
package kubeapi

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// UserAgent is what nri-gpu's requests to the API server name it.
const UserAgent = "nri-gpu"

// Config returns the configuration of a client of the API server: the
// kubeconfig file when one is given (key dra.kubeconfig), else in-cluster
// (the pod's service account; an error outside a pod, or without the
// token mounted).
func Config(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API server client (key dra.kubeconfig): %w", err)
	}
	cfg.UserAgent = UserAgent
	return cfg, nil
}
