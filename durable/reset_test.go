package durable_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// resetter is what TestResetUnderLoad drives: a limiter or a composite.
type resetter interface {
	ratekit.Limiter
	ratekit.Refunder
	ratekit.Resetter
}

// TestResetUnderLoad resets one key while other goroutines take and refund
// it with idempotency keys (a retry sent twice, a refund of a charge racing
// the charge): every call succeeds. A reset takes the key's locks in the
// order every take does, so it neither deadlocks with them nor is chosen as
// a deadlock victim, for every algorithm alone and for a composite of all
// four (two of them on another key, through parts).
func TestResetUnderLoad(t *testing.T) {
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			s := newStore(t, srv.url(t), 16)
			p := pgstoretest.Prefix(t)
			var ls []*durable.Limiter
			for i, alg := range algorithms {
				ls = append(ls, newLimiter(t, s, alg, alg.String(), fmt.Sprintf("%s-%d", p, i), 1000, farWindow))
			}
			cases := []struct {
				name  string
				l     resetter
				parts []ratekit.Part
			}{
				{"composite", newComposite(t, ls[3], ls[0], ls[2], ls[1]), nil},
				{"composite-parts", newComposite(t, ls[1], ls[3], ls[0], ls[2]), []ratekit.Part{{Key: "k", Cost: 1}, {Key: "other", Cost: 1}, {Key: "k", Cost: 1}, {Key: "other", Cost: 1}}},
				{"composite-other-keys", newComposite(t, ls[2], ls[0], ls[3], ls[1]), []ratekit.Part{{Key: "x", Cost: 1}, {Key: "y", Cost: 1}, {Key: "y", Cost: 1}, {Key: "x", Cost: 1}}},
			}
			for i, l := range ls {
				cases = append(cases, struct {
					name  string
					l     resetter
					parts []ratekit.Part
				}{algorithms[i].String(), l, nil})
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					hammerReset(t, c.l, c.parts)
				})
			}
		})
	}
}

// hammerReset runs 16 goroutines on key "k" for a second: a quarter of the
// calls are resets, the others takes and refunds with one of eight
// idempotency keys. It fails on the first error.
func hammerReset(t *testing.T, l resetter, parts []ratekit.Part) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	until := time.Now().Add(time.Second)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		calls    int
	)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			n := 0
			for time.Now().Before(until) {
				req := ratekit.Request{Key: "k", Cost: 1, Parts: parts, IdempotencyKey: fmt.Sprintf("order-%d", r.IntN(8))}
				var err error
				switch x := r.IntN(4); {
				case x == 0:
					err = l.Reset(ctx, "k")
				case x == 1:
					_, err = l.Refund(ctx, req)
				default:
					_, err = l.Allow(ctx, req)
				}
				n++
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("goroutine %d, call %d: %w", w, n, err)
					}
					mu.Unlock()
					return
				}
			}
			mu.Lock()
			calls += n
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	t.Logf("%d calls, a quarter of them resets", calls)
}
