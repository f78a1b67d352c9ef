package dynamostore_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
)

// meter sums the consumed capacity a Store reports, with the requests
// that consumed it.
type meter struct {
	mu    sync.Mutex
	units float64
	n     int
}

func (m *meter) add(c *types.ConsumedCapacity) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.CapacityUnits != nil {
		m.units += *c.CapacityUnits
	}
	m.n++
}

func (m *meter) take() (float64, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	u, n := m.units, m.n
	m.units, m.n = 0, 0
	return u, n
}

// TestCapacityUnits reads ConsumedCapacity (ReturnConsumedCapacity TOTAL)
// for the decisions docs/dynamodb.md prices, and checks the requests each
// sends: a single-key take, a plan-shaped decision (a token bucket and a
// monthly counter in one group) in steady state, the take that moves the
// counter to its next period (with its history item), and an idempotent
// decision. Items are under 1 KB, so each write is 1 write unit and each
// strongly consistent read 1 read unit.
func TestCapacityUnits(t *testing.T) {
	clock := fakeclock.New(t0)
	client := newClient(t, nil)
	// A short prefix, as production would use.
	s := newStore(t, client, dynamostore.Config{Prefix: fmt.Sprintf("c%x:", time.Now().UnixNano()%1e9), Now: clock.Now})
	var m meter
	dynamostore.SetCapacityObserver(s, m.add)
	ctx := context.Background()
	p := month(t0.Add(-time.Hour), 100_000)
	plan := func(p *kvstore.PeriodBounds) []kvstore.Update {
		return []kvstore.Update{
			{Key: "rate", Refill: kvstore.Refill{Burst: 10 * unit, Rate: 10 * unit / 1e6}, N: unit},
			{Key: "month", Period: p, N: 1},
		}
	}
	measure := func(what string, f func()) (float64, int) {
		m.take()
		f()
		u, n := m.take()
		t.Logf("%-44s %4.1f units in %d requests", what, u, n)
		return u, n
	}
	var lines []string
	check := func(what string, gotU float64, gotN int, wantU float64, wantN int) {
		t.Helper()
		lines = append(lines, fmt.Sprintf("%s: %.1f units, %d requests", what, gotU, gotN))
		if gotU != wantU || gotN != wantN {
			t.Errorf("%s: %.1f units in %d requests, want %.1f in %d", what, gotU, gotN, wantU, wantN)
		}
	}
	// Single-key take, steady state (the second take on the key).
	r := kvstore.Refill{Burst: 100 * unit, Rate: unit / 1e6}
	for i := 0; i < 2; i++ {
		u, n := measure("single-key take", func() {
			if _, err := s.Update(ctx, "single", r, kvstore.OpTake, unit); err != nil {
				t.Fatal(err)
			}
		})
		if i == 1 {
			check("single-key take", u, n, 1, 1)
		}
	}
	// Plan-shaped decision: the first creates the counter (a blind take
	// that finds no record, a read, a write); then steady state.
	for i := 0; i < 3; i++ {
		clock.Add(time.Second)
		u, n := measure("plan decision", func() { mustMulti(t, s, "cust", kvstore.OpTake, plan(p)) })
		if i == 2 {
			check("plan decision, steady state", u, n, 1, 1)
		}
	}
	// The move to the next period: a read, the write with the pending
	// period, the history item, the pending period's removal.
	clock.Add(30 * 24 * time.Hour)
	next := month(t0.Add(30*24*time.Hour-time.Hour), 100_000)
	u, n := measure("move to the next period", func() { mustMulti(t, s, "cust", kvstore.OpTake, plan(next)) })
	check("move to the next period", u, n, 4, 4)
	// An idempotent decision: two reads and a write; every fourth moves
	// the records (four PutItems and an UpdateItem).
	var total float64
	var reqs int
	for i := 0; i < 4; i++ {
		clock.Add(time.Second)
		u, n := measure("idempotent decision", func() {
			res := make([]kvstore.OpResult, 2)
			if _, err := s.UpdateMultiOnce(ctx, "cust", fmt.Sprint("req-", i), time.Hour, kvstore.OpTake, plan(next), res); err != nil {
				t.Fatal(err)
			}
		})
		if i == 0 {
			check("idempotent decision", u, n, 3, 3)
		}
		total += u
		reqs += n
	}
	check("four idempotent decisions", total, reqs, 17, 17)
	sort.Strings(lines)
	t.Log("\n" + strings.Join(lines, "\n"))
}
