package dra

import (
	"context"
	"slices"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nri-gpu/nri-gpu/internal/nodestate/node"
)

// DefaultHealthResend is how often the device health is sent to the
// kubelet again when nothing changed: the kubelet takes a device's health
// for Unknown once its last report is 30 s old (its default timeout, and
// the only one before Kubernetes 1.36).
const DefaultHealthResend = 10 * time.Second

// notOnNode is the message of a prepared claim's device that the node no
// longer has (its GPU gone from the driver, or the driver unusable).
const notOnNode = "not on the node now: the driver no longer lists it"

// healthReport is the health of the devices the driver publishes in st,
// from the same source as their taints (st.Unhealthy: XID events, GPUs
// NVML lost): Unhealthy with the reason as the message, else Healthy;
// and of the devices of prepared claims that st no longer has, Unhealthy.
// The caller holds mu.
func (d *Driver) healthReport(st *node.State, now time.Time) kubeletplugin.DeviceHealthReport {
	var rep kubeletplugin.DeviceHealthReport
	seen := map[string]bool{}
	for _, u := range units(st) {
		h := kubeletplugin.DeviceHealth{PoolName: d.nodeName, DeviceName: u.name, Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now}
		if why := st.Unhealthy[u.gpu.UUID]; why != "" {
			h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, why
		}
		seen[u.name] = true
		rep.Devices = append(rep.Devices, h)
	}
	var gone []string
	for _, cc := range d.ckpt.Claims {
		for _, dv := range cc.Devices {
			if !seen[dv.Device] {
				seen[dv.Device] = true
				gone = append(gone, dv.Device)
			}
		}
	}
	slices.Sort(gone)
	for _, name := range gone {
		rep.Devices = append(rep.Devices, kubeletplugin.DeviceHealth{PoolName: d.nodeName, DeviceName: name,
			Health: kubeletplugin.HealthStatusUnhealthy, Message: notOnNode, LastUpdated: now})
	}
	return rep
}

// sameHealth reports whether two reports say the same of the same
// devices (their times aside).
func sameHealth(a, b kubeletplugin.DeviceHealthReport) bool {
	return slices.EqualFunc(a.Devices, b.Devices, func(x, y kubeletplugin.DeviceHealth) bool {
		return x.PoolName == y.PoolName && x.DeviceName == y.DeviceName && x.Health == y.Health && x.Message == y.Message
	})
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: the kubelet's
// DRAResourceHealth stream (dra-health v1, and v1alpha1 for kubelets
// before 1.37, both served by the helper), which it turns into the
// allocatedResourcesStatus of the containers of pods whose claims have
// the devices (feature gate ResourceHealthStatus). It sends every
// published device's health at once, again whenever the node's state
// changes it, and every resend interval unchanged.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	changed := make(chan struct{}, 1)
	cancel := d.node.Subscribe(func(*node.State) {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	defer cancel()
	resend := d.healthResend
	if resend <= 0 {
		resend = DefaultHealthResend
	}
	tick := time.NewTicker(resend)
	defer tick.Stop()
	d.log.WithField("resend", resend).Info("DRA: the kubelet watches device health: XID events and lost GPUs reach the pods' allocatedResourcesStatus")
	var last kubeletplugin.DeviceHealthReport
	due := true
	for {
		d.mu.Lock()
		rep := d.healthReport(d.node.State(), time.Now())
		d.mu.Unlock()
		if due || !sameHealth(rep, last) {
			select {
			case <-ctx.Done():
				return nil
			case reports <- rep:
			}
			last = rep
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			due = false
		case <-tick.C:
			due = true
		}
	}
}
