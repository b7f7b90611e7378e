package suite

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// draOpStats is the kubelet's histogram dra_grpc_operations_duration_seconds
// of one driver and gRPC method (calls answered OK only): how long the
// kubelet waited for the driver's NodePrepareResources or
// NodeUnprepareResources. (dra_operations_duration_seconds has no driver
// label: it times all of a pod's claims together.)
type draOpStats struct {
	count   float64
	sum     float64
	buckets map[float64]float64 // le -> cumulative count
}

// draMetricRE is a line of the histogram.
var draMetricRE = regexp.MustCompile(`^dra_grpc_operations_duration_seconds_(bucket|sum|count)\{([^}]*)\} (\S+)$`)

// labelRE is one label of a metric line.
var labelRE = regexp.MustCompile(`(\w+)="([^"]*)"`)

// kubeletDRAMetrics reads node's kubelet's /metrics (through the API
// server's node proxy) and returns the histogram by "<driver> <method>"
// (as "gpu.nvidia.com NodePrepareResources"), calls answered OK only.
func kubeletDRAMetrics(k kc, node string) (map[string]*draOpStats, error) {
	out, err := k.c.Kubectl(k.ctx, "get", "--raw", "/api/v1/nodes/"+node+"/proxy/metrics")
	if err != nil {
		return nil, err
	}
	return parseDRAMetrics(out), nil
}

// parseDRAMetrics reads the histogram out of a /metrics text.
func parseDRAMetrics(out string) map[string]*draOpStats {
	stats := map[string]*draOpStats{}
	for _, line := range strings.Split(out, "\n") {
		m := draMetricRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range labelRE.FindAllStringSubmatch(m[2], -1) {
			labels[l[1]] = l[2]
		}
		if labels["grpc_status_code"] != "OK" {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		// The method is gRPC's full name, as
		// "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources".
		method := labels["method_name"]
		key := labels["driver_name"] + " " + method[strings.LastIndex(method, "/")+1:]
		s := stats[key]
		if s == nil {
			s = &draOpStats{buckets: map[float64]float64{}}
			stats[key] = s
		}
		switch m[1] {
		case "count":
			s.count = v
		case "sum":
			s.sum = v
		case "bucket":
			le, err := strconv.ParseFloat(labels["le"], 64)
			if err == nil {
				s.buckets[le] = v
			}
		}
	}
	return stats
}

// quantile is the histogram's q-quantile by linear interpolation within
// its bucket, as Prometheus's histogram_quantile estimates it.
func (s *draOpStats) quantile(q float64) float64 {
	var les []float64
	for le := range s.buckets {
		les = append(les, le)
	}
	sort.Float64s(les)
	rank := q * s.count
	prevLE, prevCount := 0.0, 0.0
	for _, le := range les {
		c := s.buckets[le]
		if c >= rank {
			if math.IsInf(le, 1) {
				return prevLE
			}
			if c == prevCount {
				return le
			}
			return prevLE + (le-prevLE)*(rank-prevCount)/(c-prevCount)
		}
		prevLE, prevCount = le, c
	}
	return math.NaN()
}

// String is the histogram in a line: calls, mean, estimated median and
// 90th percentile.
func (s *draOpStats) String() string {
	if s == nil || s.count == 0 {
		return "no calls"
	}
	return fmt.Sprintf("%.0f calls, mean %.1f ms, p50 ~%.1f ms, p90 ~%.1f ms (the kubelet's buckets)", s.count, 1000*s.sum/s.count, 1000*s.quantile(0.5), 1000*s.quantile(0.9))
}
