// Package metrics exposes what the plugin does as Prometheus metrics, and
// the health endpoints (/healthz, /readyz) that probes and operators use.
// It implements plugin.Observer without importing the plugin: the plugin
// tells it about requests, refreshes and connections.
package metrics

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// Metrics holds nri-gpu's metrics in their own registry.
type Metrics struct {
	reg         *prometheus.Registry
	requests    *prometheus.CounterVec
	latency     prometheus.Histogram
	gpus        prometheus.Counter
	perGPU      *prometheus.CounterVec
	refreshes   *prometheus.CounterVec
	connections prometheus.Counter
	driver      *prometheus.GaugeVec
	invGPUs     prometheus.Gauge
	invFiles    prometheus.Gauge
	allocs      *allocCollector
	xids        *prometheus.CounterVec
	unhealthy   *prometheus.GaugeVec
	notReady    atomic.Pointer[func() error]
}

// New returns the metrics, registered with the Go runtime's and the
// process's collectors (process_resident_memory_bytes among them).
// version is reported as nri_gpu_build_info.
func New(version string) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_gpu_requests_total",
			Help: "CreateContainer requests, by request source (container-annotation, pod-annotation, cdi-annotation, device-list, env, none) and outcome (injected, untouched, refused).",
		}, []string{"source", "outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "nri_gpu_request_duration_seconds",
			Help:    "Time the plugin takes to answer a CreateContainer request (parse, select, build the adjustment).",
			Buckets: prometheus.ExponentialBuckets(5e-6, 2, 12), // 5µs .. ~10ms
		}),
		gpus: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nri_gpu_gpus_injected_total",
			Help: "GPUs injected into containers, summed over containers.",
		}),
		perGPU: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_gpu_gpu_injections_total",
			Help: "Containers each GPU was injected into, by GPU index and UUID.",
		}, []string{"index", "uuid"}),
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_gpu_inventory_refreshes_total",
			Help: "Rediscoveries of the node, by result: changed (new snapshot swapped in), unchanged, rejected (broken driver: the last good snapshot stays), error (discovery failed: the last good snapshot stays).",
		}, []string{"result"}),
		connections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nri_gpu_runtime_connections_total",
			Help: "Connections to the runtime that reached synchronization; more than one means the plugin reconnected.",
		}),
		driver: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nri_gpu_driver_info",
			Help: "The driver version of the current inventory snapshot (value 1; empty version: no driver).",
		}, []string{"version"}),
		invGPUs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nri_gpu_inventory_gpus",
			Help: "GPUs the current inventory snapshot offers.",
		}),
		invFiles: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nri_gpu_inventory_driver_files",
			Help: "Driver files (libraries, binaries, firmware) the current inventory snapshot offers.",
		}),
		allocs: &allocCollector{desc: prometheus.NewDesc("nri_gpu_gpu_allocations",
			"Containers currently holding each GPU in the allocation table.",
			[]string{"index", "uuid"}, nil)},
	}
	m.xids = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nri_gpu_xid_events_total",
		Help: "XID events NVML reported, by XID and whether it was critical (not in health.ignoredXIDs).",
	}, []string{"xid", "critical"})
	m.unhealthy = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nri_gpu_device_unhealthy",
		Help: "GPUs and MIG devices that are unhealthy (value 1), by UUID and why (an XID, a GPU NVML cannot query); count requests skip them.",
	}, []string{"uuid", "reason"})
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nri_gpu_build_info",
		Help: "The nri-gpu version (value 1).",
	}, []string{"version"})
	build.WithLabelValues(version).Set(1)
	ready := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nri_gpu_ready",
		Help: "1 when the plugin is ready (connected to the runtime, synchronized, an inventory loaded: what /readyz answers), else 0.",
	}, func() float64 {
		if f := m.notReady.Load(); f != nil && (*f)() == nil {
			return 1
		}
		return 0
	})
	m.reg.MustRegister(m.requests, m.latency, m.gpus, m.perGPU, m.refreshes, m.connections,
		m.driver, m.invGPUs, m.invFiles, m.allocs, m.xids, m.unhealthy, build, ready,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// XID counts an XID event (node.HealthObserver).
func (m *Metrics) XID(xid uint64, critical bool) {
	m.xids.WithLabelValues(strconv.FormatUint(xid, 10), strconv.FormatBool(critical)).Inc()
}

// Unhealthy sets the unhealthy devices (node.HealthObserver).
func (m *Metrics) Unhealthy(bad map[string]string) {
	m.unhealthy.Reset()
	for id, why := range bad {
		m.unhealthy.WithLabelValues(id, why).Set(1)
	}
}

// Request counts a CreateContainer request (plugin.Observer).
func (m *Metrics) Request(source, outcome string, gpus []inventory.GPU, took time.Duration) {
	m.requests.WithLabelValues(source, outcome).Inc()
	m.latency.Observe(took.Seconds())
	if len(gpus) > 0 {
		m.gpus.Add(float64(len(gpus)))
		for _, g := range gpus {
			m.perGPU.WithLabelValues(inventory.UnitLabel(g.Index), g.UUID).Inc()
		}
	}
}

// Refresh counts a rediscovery of the node (plugin.Observer).
func (m *Metrics) Refresh(result string) { m.refreshes.WithLabelValues(result).Inc() }

// Connected counts a synchronized connection to the runtime
// (plugin.Observer).
func (m *Metrics) Connected() { m.connections.Inc() }

// Inventory reports the current snapshot (plugin.Observer).
func (m *Metrics) Inventory(snap *inventory.Snapshot) {
	m.driver.Reset()
	m.driver.WithLabelValues(snap.DriverVersion).Set(1)
	m.invGPUs.Set(float64(len(snap.GPUs)))
	m.invFiles.Set(float64(len(snap.Files)))
}

// Allocation is one GPU's count of holders in the allocation table.
type Allocation struct {
	Index   int
	UUID    string
	Holders int
}

// SetAllocations makes f the source of nri_gpu_gpu_allocations: at each
// scrape it is called and returns the holders of each GPU. Without it the
// metric is absent. f must be safe for concurrent use.
func (m *Metrics) SetAllocations(f func() []Allocation) { m.allocs.f.Store(&f) }

// allocCollector reports allocations per GPU from a callback.
type allocCollector struct {
	desc *prometheus.Desc
	f    atomic.Pointer[func() []Allocation]
}

func (c *allocCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *allocCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.f.Load()
	if f == nil {
		return
	}
	for _, a := range (*f)() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(a.Holders), inventory.UnitLabel(a.Index), a.UUID)
	}
}
