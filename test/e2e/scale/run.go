package scale

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Plan is what Run measures on the cluster as it is.
type Plan struct {
	// Fills are the fractions of the devices allocated before each
	// measurement (0, 0.5, 0.9).
	Fills []float64
	// Features are the claim kinds measured on each shape; Baseline
	// (pods without claims, no slices) is measured once a round.
	Features []Feature
	// Rounds is how many times everything is measured; the shapes take
	// turns going first.
	Rounds int
	// Pods is how many pods one measurement creates.
	Pods int
	// Budget, when set, ends the rounds early: no round starts that the
	// slowest round so far would carry past Budget from the first's
	// start (at least one round runs).
	Budget time.Duration
}

// another reports whether a round fits in p's budget, started after
// elapsed with rounds so far the slowest of which took slowest.
func (p Plan) another(elapsed, slowest time.Duration) bool {
	return p.Budget <= 0 || elapsed+slowest <= p.Budget
}

// settle is how long the bench waits after allocating a fill for the
// scheduler's informers to have it (a claim pod measured before would be
// allocated a filled device: check catches that).
func settle(claims int) time.Duration { return 2*time.Second + time.Duration(claims)*time.Millisecond }

// Run measures p on the cluster's nodes for each shape, rounds
// interleaved: in each round, variant by variant, each shape in turn (the
// shapes take turns going first), so that the two shapes' measurements
// of a row are minutes apart at most on a machine whose load changes. It
// checks each measurement's allocations against its fill (check).
func (c *Cluster) Run(ctx context.Context, p Plan, shapes []*Shape) ([]Result, error) {
	var out []Result
	// A warm-up, not counted: the first pods after the cluster started
	// wait for the node lifecycle controller to lift the new nodes'
	// not-ready taints.
	if _, err := c.Measure(ctx, nil, Baseline, p.Pods); err != nil {
		return out, err
	}
	start, slowest := time.Now(), time.Duration(0)
	for round := range p.Rounds {
		if round > 0 && !p.another(time.Since(start), slowest) {
			c.Logf("%d rounds of %d in %s: another would pass the budget of %s", round, p.Rounds, time.Since(start).Round(time.Second), p.Budget)
			break
		}
		began := time.Now()
		if err := c.Publish(ctx, nil, ""); err != nil {
			return out, err
		}
		r, err := c.Measure(ctx, nil, Baseline, p.Pods)
		if err != nil {
			return out, err
		}
		r.Round = round
		out = append(out, r)
		c.Logf("%s", r)
		for _, v := range Variants {
			var feats []Feature
			for _, f := range p.Features {
				if f != Baseline && f.Variant() == v {
					feats = append(feats, f)
				}
			}
			if len(feats) == 0 {
				continue
			}
			for k := range shapes {
				s := shapes[(k+round)%len(shapes)]
				rs, err := c.runVariant(ctx, p, s, v, feats, round)
				out = append(out, rs...)
				if err != nil {
					return out, err
				}
			}
		}
		slowest = max(slowest, time.Since(began))
	}
	return out, c.Publish(ctx, nil, "")
}

// runVariant measures feats on shape s's variant v at each fill.
func (c *Cluster) runVariant(ctx context.Context, p Plan, s *Shape, v Variant, feats []Feature, round int) ([]Result, error) {
	var out []Result
	if err := c.Publish(ctx, s, v); err != nil {
		return out, err
	}
	for _, fill := range p.Fills {
		filled, err := c.Fill(ctx, s, v, fill)
		if err != nil {
			return out, err
		}
		time.Sleep(settle(len(filled.devices)))
		for _, f := range feats {
			r, err := c.Measure(ctx, s, f, p.Pods)
			if err != nil {
				return out, err
			}
			r.Fill, r.Round = fill, round
			if err := check(r, s, filled); err != nil {
				return out, err
			}
			out = append(out, r)
			c.Logf("%s", r)
		}
		if err := c.ClearFill(ctx); err != nil {
			return out, err
		}
	}
	return out, nil
}

// check fails a measurement whose claims got a device twice, or a
// device the fill holds, or more memory of a GPU than it has.
func check(r Result, s *Shape, filled *Filled) error {
	whole := map[deviceID]string{}
	shares := map[deviceID]int64{}
	for claim, ids := range r.allocated {
		if len(ids) != 1 {
			return fmt.Errorf("%s: claim %s got %d devices, want 1", r, claim, len(ids))
		}
		id := ids[0]
		if id.driver != s.Driver {
			return fmt.Errorf("%s: claim %s got a device of driver %s", r, claim, id.driver)
		}
		if r.Feature == Share {
			if id.share == "" {
				return fmt.Errorf("%s: claim %s got %s whole, want a share", r, claim, id.device)
			}
			id.share = ""
			shares[id] += 4 << 30
			continue
		}
		if filled.devices[id] {
			return fmt.Errorf("%s: claim %s got %s/%s, which the fill holds", r, claim, id.pool, id.device)
		}
		if other, ok := whole[id]; ok {
			return fmt.Errorf("%s: claims %s and %s both got %s/%s", r, claim, other, id.pool, id.device)
		}
		whole[id] = claim
	}
	if len(r.allocated) != r.Pods && r.Feature != Baseline {
		return fmt.Errorf("%s: %d claims allocated, want %d", r, len(r.allocated), r.Pods)
	}
	for id, used := range shares {
		if filled.share+used > s.GPUMemory() {
			return fmt.Errorf("%s: %s/%s: shares of %s beside the fill's %s, more than its %s", r, id.pool, id.device,
				resource.NewQuantity(used, resource.BinarySI), resource.NewQuantity(filled.share, resource.BinarySI),
				resource.NewQuantity(s.GPUMemory(), resource.BinarySI))
		}
	}
	return nil
}

func (r Result) String() string {
	return fmt.Sprintf("%d nodes, %s, %s, fill %.0f%%, round %d: %d pods, %.1f pods/s (created at %.0f/s), bound p50 %s p99 %s, Running p50 %s p99 %s; CPU a pod: scheduler %s, API server %s, etcd %s (load %s)",
		r.Nodes, r.Shape, r.Feature, r.Fill*100, r.Round, r.Pods, r.PodsPerSec, r.CreatedPerSec, ms(r.BoundP50), ms(r.BoundP99), ms(r.RunningP50), ms(r.RunningP99),
		us(r.SchedulerCPU), us(r.APIServerCPU), us(r.EtcdCPU), r.Load)
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }

func us(d time.Duration) string { return d.Round(10 * time.Microsecond).String() }
