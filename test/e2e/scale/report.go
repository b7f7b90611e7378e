package scale

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Table writes rs as a Markdown table, a row per node count, feature and
// fill: each shape's pods a second (median of the rounds, [min-max]),
// the ratio of the first shape's to the second's (median of the rounds'
// ratios, each round's two measured side by side, [min-max]), each
// shape's bound p99 (median of the rounds); the GPU-less baseline a row
// per node count.
func Table(rs []Result, a, b string) string {
	type key struct {
		nodes   int
		feature Feature
		fill    float64
	}
	type cell map[int]Result // by round
	rows := map[key]map[string]cell{}
	for _, r := range rs {
		k := key{r.Nodes, r.Feature, r.Fill}
		if rows[k] == nil {
			rows[k] = map[string]cell{}
		}
		if rows[k][r.Shape] == nil {
			rows[k][r.Shape] = cell{}
		}
		rows[k][r.Shape][r.Round] = r
	}
	keys := make([]key, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	order := map[Feature]int{Baseline: 0, Plain: 1, CEL: 2, Share: 3, MIGDevice: 4}
	sort.Slice(keys, func(i, j int) bool {
		x, y := keys[i], keys[j]
		if x.nodes != y.nodes {
			return x.nodes < y.nodes
		}
		if x.feature != y.feature {
			return order[x.feature] < order[y.feature]
		}
		return x.fill < y.fill
	})
	var sb strings.Builder
	fmt.Fprintf(&sb, "| nodes | claim | fill | %s pods/s | %s pods/s | %s / %s | bound p99 %s | bound p99 %s |\n", a, b, a, b, a, b)
	sb.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, k := range keys {
		row := rows[k]
		if k.feature == Baseline {
			c := row["none"]
			fmt.Fprintf(&sb, "| %d | %s | - | %s | | | %s | |\n", k.nodes, k.feature, rate(c), p99(c))
			continue
		}
		fmt.Fprintf(&sb, "| %d | %s | %.0f%% | %s | %s | %s | %s | %s |\n", k.nodes, k.feature, k.fill*100,
			rate(row[a]), rate(row[b]), ratio(row[a], row[b]), p99(row[a]), p99(row[b]))
	}
	sb.WriteString("\nCPU time a pod took (ms), from the scheduler's resume to the last pod bound (median of the rounds [min-max]; ")
	fmt.Fprintf(&sb, "%s / %s above 1: %s's pods cost the scheduler less):\n\n", b, a, a)
	fmt.Fprintf(&sb, "| nodes | claim | fill | scheduler %s | scheduler %s | %s / %s | API server %s | API server %s |\n", a, b, b, a, a, b)
	sb.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, k := range keys {
		row := rows[k]
		if k.feature == Baseline {
			c := row["none"]
			fmt.Fprintf(&sb, "| %d | %s | - | %s | | | %s | |\n", k.nodes, k.feature, cpu(c, sched), cpu(c, api))
			continue
		}
		fmt.Fprintf(&sb, "| %d | %s | %.0f%% | %s | %s | %s | %s | %s |\n", k.nodes, k.feature, k.fill*100,
			cpu(row[a], sched), cpu(row[b], sched), cpuRatio(row[b], row[a]), cpu(row[a], api), cpu(row[b], api))
	}
	return sb.String()
}

func sched(r Result) time.Duration { return r.SchedulerCPU }

func api(r Result) time.Duration { return r.APIServerCPU }

// cpu is the median [min-max] of what of c's rounds, in ms.
func cpu(c map[int]Result, what func(Result) time.Duration) string {
	var v []float64
	for _, r := range c {
		v = append(v, float64(what(r))/float64(time.Millisecond))
	}
	return spread(v, "%.2f")
}

// cpuRatio is the median [min-max] of the rounds' scheduler CPU ratios
// x/y.
func cpuRatio(x, y map[int]Result) string {
	var v []float64
	for round, rx := range x {
		if ry, ok := y[round]; ok && ry.SchedulerCPU > 0 {
			v = append(v, float64(rx.SchedulerCPU)/float64(ry.SchedulerCPU))
		}
	}
	return spread(v, "%.2f")
}

// spread is the median of v and its range, "m [lo-hi]" (one value
// alone).
func spread(v []float64, format string) string {
	if len(v) == 0 {
		return "-"
	}
	sort.Float64s(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	if len(v) == 1 {
		return fmt.Sprintf(format, m)
	}
	return fmt.Sprintf(format+" ["+format+"-"+format+"]", m, v[0], v[len(v)-1])
}

func rate(c map[int]Result) string {
	var v []float64
	for _, r := range c {
		v = append(v, r.PodsPerSec)
	}
	return spread(v, "%.1f")
}

func ratio(a, b map[int]Result) string {
	var v []float64
	for round, ra := range a {
		if rb, ok := b[round]; ok && rb.PodsPerSec > 0 {
			v = append(v, ra.PodsPerSec/rb.PodsPerSec)
		}
	}
	return spread(v, "%.2f")
}

func p99(c map[int]Result) string {
	var v []float64
	for _, r := range c {
		v = append(v, r.BoundP99.Seconds())
	}
	if len(v) == 0 {
		return "-"
	}
	sort.Float64s(v)
	return ms(time.Duration(v[len(v)/2] * float64(time.Second)))
}
