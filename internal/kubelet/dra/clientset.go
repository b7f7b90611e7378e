package dra

import (
	"fmt"
	"net/http"

	"k8s.io/client-go/kubernetes"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	resourcev1 "k8s.io/client-go/kubernetes/typed/resource/v1"
	resourcev1beta1 "k8s.io/client-go/kubernetes/typed/resource/v1beta1"
	resourcev1beta2 "k8s.io/client-go/kubernetes/typed/resource/v1beta2"
	"k8s.io/client-go/rest"
)

// clientset is the part of the Kubernetes clientset the DRA helper
// library uses: the core group (the node) and the resource groups
// (ResourceSlices, ResourceClaims; v1beta1 and v1beta2 for the library's
// converting client, which tries v1 first). The rest of
// kubernetes.Interface is left nil: calling it panics, and nothing does.
// Building only these clients instead of kubernetes.NewForConfig keeps
// the typed clients of the other forty API groups out of the binary.
type clientset struct {
	kubernetes.Interface
	core  corev1.CoreV1Interface
	res   resourcev1.ResourceV1Interface
	resB1 resourcev1beta1.ResourceV1beta1Interface
	resB2 resourcev1beta2.ResourceV1beta2Interface
}

func (c *clientset) CoreV1() corev1.CoreV1Interface                            { return c.core }
func (c *clientset) ResourceV1() resourcev1.ResourceV1Interface                { return c.res }
func (c *clientset) ResourceV1beta1() resourcev1beta1.ResourceV1beta1Interface { return c.resB1 }
func (c *clientset) ResourceV1beta2() resourcev1beta2.ResourceV1beta2Interface { return c.resB2 }

// newClientset returns the clients of cfg that clientset holds.
func newClientset(cfg *rest.Config) (*clientset, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	return newClientsetWith(cfg, hc)
}

func newClientsetWith(cfg *rest.Config, hc *http.Client) (*clientset, error) {
	c := &clientset{}
	var err error
	if c.core, err = corev1.NewForConfigAndClient(cfg, hc); err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	if c.res, err = resourcev1.NewForConfigAndClient(cfg, hc); err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	if c.resB1, err = resourcev1beta1.NewForConfigAndClient(cfg, hc); err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	if c.resB2, err = resourcev1beta2.NewForConfigAndClient(cfg, hc); err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	return c, nil
}
