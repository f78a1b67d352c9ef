// Package linearize_test records histories of concurrent Allow, Peek,
// Refund and Reset calls on every strategy and store, with the denied-key
// cache on and off, and checks each history against a sequential model of
// the policy with a linearizability checker (porcupine): every call must
// appear to take effect at one instant between its call and its return,
// with the outputs the model gives at that instant.
//
// The policies hold a quota that does not refill during a run (a long
// window), so the model is a count per key: Allow of cost c admits when c
// units remain and takes them, Peek reports whether c units remain and how
// many do, Refund gives back up to the quota, Reset restores the quota.
package linearize_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/ratekit/ratekit"
)

// quota is every policy's quota; costs run from 1 to maxCost.
const (
	quota   = 20
	maxCost = 3
)

type kind int

const (
	allow kind = iota
	peek
	refund
	reset
)

func (k kind) String() string { return [...]string{"Allow", "Peek", "Refund", "Reset"}[k] }

// input is one call: its kind, key and cost.
type input struct {
	kind kind
	key  string
	cost int64
}

// output is what the call returned: the decision's Allowed and the
// Remaining of each policy (one for a single limiter, up to four).
type output struct {
	allowed   bool
	remaining [4]int64
}

// state is the remaining count of each policy of one key.
type state [4]int64

// limiter is what a history drives: a limiter of one or two policies
// (parts reports how many) with Peek, Refund and Reset.
type limiter interface {
	ratekit.Limiter
	ratekit.Peeker
	ratekit.Refunder
	ratekit.Resetter
}

// model returns the sequential specification of a limiter of parts
// policies of quota units each.
func model(parts int) porcupine.Model {
	full := state{}
	for i := range parts {
		full[i] = quota
	}
	return porcupine.Model{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			byKey := map[string][]porcupine.Operation{}
			var keys []string
			for _, op := range h {
				k := op.Input.(input).key
				if _, ok := byKey[k]; !ok {
					keys = append(keys, k)
				}
				byKey[k] = append(byKey[k], op)
			}
			out := make([][]porcupine.Operation, 0, len(keys))
			for _, k := range keys {
				out = append(out, byKey[k])
			}
			return out
		},
		Init: func() any { return full },
		Step: func(st, in, out any) (bool, any) {
			s, i, o := st.(state), in.(input), out.(output)
			switch i.kind {
			case reset:
				return true, full
			case refund:
				n := s
				for p := range parts {
					n[p] = min(quota, s[p]+i.cost)
				}
				return o.allowed && o.remaining == n, n
			}
			fits := true
			for p := range parts {
				fits = fits && i.cost <= s[p]
			}
			want := s
			if fits && i.kind == allow {
				for p := range parts {
					want[p] -= i.cost
				}
			}
			return o.allowed == fits && o.remaining == want, want
		},
		DescribeOperation: func(in, out any) string {
			i, o := in.(input), out.(output)
			if i.kind == reset {
				return fmt.Sprintf("Reset(%s)", i.key)
			}
			return fmt.Sprintf("%s(%s, %d) -> allowed=%v r=%v", i.kind, i.key, i.cost, o.allowed, o.remaining)
		},
		DescribeState: func(st any) string { return fmt.Sprint(st.(state)) },
	}
}

// config is one configuration under test.
type config struct {
	name  string
	parts int
	// new returns a limiter whose keys no other run uses.
	new func(t *testing.T, cache bool) limiter
	// noCache marks a limiter that has no denied-key cache.
	noCache bool
	// runs is how many histories to record with the cache off and on
	// (zero: 5); a store with no network between the calls interleaves
	// them less and needs more.
	runs int
}

// mix is the share of each kind of call, cumulative in percent: 55% Allow,
// 15% Peek, 27% Refund, 3% Reset.
var mix = [...]int{allow: 55, peek: 70, refund: 97}

// record runs workers goroutines making ops calls in all on keys, and
// returns the history. A call that fails fails the test: the stores under
// test are healthy, and a failed call's effect is unknown.
func record(t *testing.T, l limiter, parts, workers, ops int, keys []string, seed uint64) []porcupine.Operation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	var (
		mu      sync.Mutex
		history []porcupine.Operation
		wg      sync.WaitGroup
		errs    = make(chan error, workers)
	)
	for w := range workers {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for range ops / workers {
				in := input{key: keys[rng.IntN(len(keys))], cost: 1 + rng.Int64N(maxCost)}
				switch r := rng.IntN(100); {
				case r < mix[allow]:
					in.kind = allow
				case r < mix[peek]:
					in.kind = peek
				case r < mix[refund]:
					in.kind = refund
				default:
					in.kind = reset
				}
				req := ratekit.Request{Key: in.key, Cost: in.cost}
				call := time.Since(start).Nanoseconds()
				var (
					d   ratekit.Decision
					err error
				)
				switch in.kind {
				case allow:
					d, err = l.Allow(ctx, req)
				case peek:
					d, err = l.Peek(ctx, req)
				case refund:
					d, err = l.Refund(ctx, req)
				case reset:
					err = l.Reset(ctx, in.key)
				}
				ret := time.Since(start).Nanoseconds()
				if err != nil {
					errs <- fmt.Errorf("%s: %w", in.kind, err)
					return
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: w, Input: in, Call: call, Output: outputOf(d, parts), Return: ret})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return history
}

// outputOf returns what a history records of d, a decision of a limiter of
// parts policies.
func outputOf(d ratekit.Decision, parts int) output {
	out := output{allowed: d.Allowed}
	if parts == 1 {
		out.remaining[0] = d.Remaining
		return out
	}
	for p, part := range d.Parts {
		out.remaining[p] = part.Remaining
	}
	return out
}

// check checks one history and returns a description of the violation, or
// "" when the history is linearizable.
func check(t *testing.T, parts int, h []porcupine.Operation) string {
	t.Helper()
	res, info := porcupine.CheckOperationsVerbose(model(parts), h, 30*time.Second)
	switch res {
	case porcupine.Ok:
		return ""
	case porcupine.Unknown:
		t.Fatalf("the checker timed out on a history of %d operations", len(h))
	}
	return describe(parts, h, info)
}

// describe renders the longest linearizable prefix of the partition that
// failed, and the operations that could not follow it.
func describe(parts int, h []porcupine.Operation, info porcupine.LinearizationInfo) string {
	m := model(parts)
	var b strings.Builder
	for _, partition := range info.PartialLinearizationsOperations() {
		longest := []porcupine.Operation{}
		for _, lin := range partition {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
		if len(longest) == 0 {
			continue
		}
		size := 0
		for _, op := range h {
			if op.Input.(input).key == longest[0].Input.(input).key {
				size++
			}
		}
		if len(longest) == size {
			continue // this key's partition is linearizable
		}
		st := m.Init()
		fmt.Fprintf(&b, "longest linearizable prefix (%d operations), its last steps:\n", len(longest))
		for i, op := range longest {
			_, st = m.Step(st, op.Input, op.Output)
			if i >= len(longest)-12 {
				fmt.Fprintf(&b, "  %-60s state %v\n", m.DescribeOperation(op.Input, op.Output), st)
			}
		}
		b.WriteString("none of the operations left can follow it; those called first:\n")
		var pending []porcupine.Operation
		for _, op := range h {
			if op.Input.(input).key == longest[0].Input.(input).key && (os.Getenv("LINEARIZE_ALL") != "" || !contains(longest, op)) {
				pending = append(pending, op)
			}
		}
		slices.SortFunc(pending, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		for i, op := range pending {
			if i == 6 && os.Getenv("LINEARIZE_ALL") == "" {
				break
			}
			fmt.Fprintf(&b, "  %s [call %d ns, return %d ns]\n", m.DescribeOperation(op.Input, op.Output), op.Call, op.Return)
		}
		break
	}
	return b.String()
}

func contains(ops []porcupine.Operation, op porcupine.Operation) bool {
	for _, o := range ops {
		if o.Call == op.Call && o.Return == op.Return && o.ClientId == op.ClientId {
			return true
		}
	}
	return false
}

// checkConfig records and checks runs histories of c, cache off and on.
func checkConfig(t *testing.T, c config) {
	for _, cache := range []bool{false, true} {
		if cache && c.noCache {
			continue
		}
		name := "cache=off"
		if cache {
			name = "cache=on"
		}
		t.Run(name, func(t *testing.T) {
			runs := c.runs
			if runs == 0 {
				runs = 5
			}
			ops := 0
			for run := range runs {
				l := c.new(t, cache)
				workers := 8 + run%3*4 // 8, 12 and 16
				keys := []string{"a", "b"}
				h := record(t, l, c.parts, workers, 400, keys, uint64(run)+1)
				ops += len(h)
				if v := check(t, c.parts, h); v != "" {
					t.Fatalf("run %d (%d goroutines): the history is not linearizable\n%s", run, workers, v)
				}
			}
			t.Logf("%d histories, %d operations, all linearizable", runs, ops)
		})
	}
}
