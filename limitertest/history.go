package limitertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ratekit/ratekit"
)

// Outcome is what one recorded decision returned.
type Outcome int

const (
	// Admitted: Allow returned a Decision with Allowed true.
	Admitted Outcome = iota + 1
	// Denied: Allow returned a Decision with Allowed false.
	Denied
	// Failed: Allow returned an error. The request may or may not have been
	// counted by the store, so the checker never counts it as admitted.
	Failed
)

// Op is one recorded decision: its key, cost and outcome, and the interval
// of real time between the call and its return. The decision took effect at
// one instant inside [Start, End] (its linearization point).
type Op struct {
	Key        string
	Cost       int64
	Outcome    Outcome
	Start, End time.Time
}

// History records the decisions that concurrent goroutines make, with
// their real-time intervals, for [History.Check]. It is safe for concurrent
// use; the zero History is empty and ready to use.
type History struct {
	mu  sync.Mutex
	ops []Op
}

// Allow calls l.Allow(ctx, req), records the call as an [Op] and returns
// what l returned.
func (h *History) Allow(ctx context.Context, l ratekit.Limiter, req ratekit.Request) (ratekit.Decision, error) {
	start := time.Now()
	d, err := l.Allow(ctx, req)
	op := Op{Key: req.Key, Cost: req.Cost, Start: start, End: time.Now(), Outcome: Denied}
	switch {
	case err != nil:
		op.Outcome = Failed
	case d.Allowed:
		op.Outcome = Admitted
	}
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
	return d, err
}

// Ops returns a copy of the recorded operations.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ops)
}

// Count returns the number of recorded operations with outcome o.
func (h *History) Count(o Outcome) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, op := range h.ops {
		if op.Outcome == o {
			n++
		}
	}
	return n
}

// A Bound is the most units a limiter may admit on one key in decisions
// whose linearization points all lie in the real-time span [a, b].
type Bound func(a, b time.Time) int64

// TokenBucketBound is the bound of a token bucket that holds at most burst
// units and refills tokens units every per: burst + tokens × (b−a)/per,
// rounded down, with the span widened by skew on each side for the clocks of
// the store and of this process.
func TokenBucketBound(burst, tokens int64, per, skew time.Duration) Bound {
	return func(a, b time.Time) int64 {
		d := b.Sub(a) + 2*skew
		return burst + int64(float64(tokens)*float64(d)/float64(per))
	}
}

// FixedWindowBound is the bound of a limiter that admits at most limit
// units in each window aligned to the Unix epoch (window start = t − t mod
// window, the store's clock): limit times the number of aligned windows the
// span, widened by skew on each side, touches. It is also the guarantee of
// the two-window weighted sliding window (ratekit.SlidingWindow), which
// never admits more than limit in one aligned window.
func FixedWindowBound(limit int64, window, skew time.Duration) Bound {
	return func(a, b time.Time) int64 {
		first := a.Add(-skew).UnixNano() / int64(window)
		last := b.Add(skew).UnixNano() / int64(window)
		return limit * (last - first + 1)
	}
}

// SlidingLogBound is the bound of a limiter that admits at most limit units
// in any interval shorter than window: limit × (⌊(b−a+2·skew)/window⌋ + 1).
func SlidingLogBound(limit int64, window, skew time.Duration) Bound {
	return func(a, b time.Time) int64 {
		return limit * (int64((b.Sub(a)+2*skew)/window) + 1)
	}
}

// ErrBoundExceeded is matched by the error [History.Check] returns for a
// history that breaks its bound.
var ErrBoundExceeded = errors.New("limitertest: a span admitted more than its bound")

// Check reports whether the recorded history could have come from a limiter
// that keeps bound, on every key. For every span [a, b] whose start is the
// start of a recorded operation and whose end is the end of one, it sums
// the cost of the admitted operations whose whole interval lies inside the
// span (their linearization points surely do) and compares the sum with
// bound(a, b). The check is sound: wherever each operation's effect took
// place inside its interval, a limiter that keeps bound passes. It is as
// tight as that allows: concurrent decisions whose intervals overlap the
// span's ends are not counted. It returns nil, or an error matching
// [ErrBoundExceeded] that names the first span found, its admitted
// operations and the bound. It takes O(n²) time in the number of admitted
// operations per key.
func (h *History) Check(bound Bound) error {
	return CheckOps(h.Ops(), bound)
}

// CheckOps is [History.Check] on ops recorded elsewhere (for example by a
// recorder of your own, or read back from a log).
func CheckOps(ops []Op, bound Bound) error {
	byKey := map[string][]Op{}
	for _, op := range ops {
		if op.Outcome == Admitted {
			byKey[op.Key] = append(byKey[op.Key], op)
		}
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := checkKey(byKey[k], bound); err != nil {
			return fmt.Errorf("key %q: %w", k, err)
		}
	}
	return nil
}

func checkKey(ops []Op, bound Bound) error {
	byEnd := slices.Clone(ops)
	slices.SortFunc(byEnd, func(x, y Op) int { return x.End.Compare(y.End) })
	for _, first := range ops {
		a := first.Start
		var sum int64
		for j, op := range byEnd {
			if op.End.Before(a) {
				continue
			}
			if !op.Start.Before(a) {
				sum += op.Cost
			}
			if max := bound(a, op.End); sum > max {
				var in []string
				for _, o := range byEnd[:j+1] {
					if !o.Start.Before(a) {
						in = append(in, fmt.Sprintf("[+%v, +%v] cost %d", o.Start.Sub(a), o.End.Sub(a), o.Cost))
					}
				}
				return fmt.Errorf("%w: %d units admitted inside [%v, +%v], bound %d: %v",
					ErrBoundExceeded, sum, a.Format(time.RFC3339Nano), op.End.Sub(a), max, in)
			}
		}
	}
	return nil
}
