package dynamostore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
)

func once(t *testing.T, s *dynamostore.Store, group, id string, op kvstore.Op, u []kvstore.Update) ([]kvstore.OpResult, bool) {
	t.Helper()
	res := make([]kvstore.OpResult, len(u))
	replayed, err := s.UpdateMultiOnce(context.Background(), group, id, kvstore.MaxIdempotencyTTL, op, u, res)
	if err != nil {
		t.Fatalf("UpdateMultiOnce(%q, %q, op %d): %v", group, id, op, err)
	}
	return res, replayed
}

func used(t *testing.T, s *dynamostore.Store, group string, p *kvstore.PeriodBounds) int64 {
	t.Helper()
	return mustMulti(t, s, group, kvstore.OpPeek, planUpdates(p)[1:])[0].Used
}

// TestOnceLostReply: the reply of an idempotent take is lost after
// DynamoDB applied it; the retry replays the recorded results and counts
// nothing more.
func TestOnceLostReply(t *testing.T) {
	e := newGroupEnv(t)
	s := e.store(nil)
	p := month(time.Now().Add(-time.Hour), 10)
	mustMulti(t, s, "g", kvstore.OpTake, planUpdates(p))
	e.fault.set(func(op string) action {
		if op == "UpdateItem" {
			return lose
		}
		return send
	})
	res := make([]kvstore.OpResult, 2)
	if _, err := s.UpdateMultiOnce(context.Background(), "g", "req-1", time.Hour, kvstore.OpTake, planUpdates(p), res); err == nil {
		t.Fatal("lost reply: nil error")
	}
	e.fault.set(nil)
	got, replayed := once(t, s, "g", "req-1", kvstore.OpTake, planUpdates(p))
	if !replayed || !got[1].OK || got[1].Used != 2 {
		t.Fatalf("retry = %+v, replayed %v; want the first call's results (used 2), replayed", got, replayed)
	}
	if n := used(t, s, "g", p); n != 2 {
		t.Fatalf("counter at %d after a take, a lost idempotent take and its retry; want 2", n)
	}
	// The same id with another op is another call.
	if _, replayed := once(t, s, "g", "req-1", kvstore.OpRefund, planUpdates(p)); replayed {
		t.Fatal("a refund with a take's id replayed the take")
	}
	if n := used(t, s, "g", p); n != 1 {
		t.Fatalf("counter at %d after the refund, want 1", n)
	}
}

// TestOnceMovedRecords: records move from the group item to items of their
// own; retries find them in either place, and a crash between the steps
// (the PutItems refused, or the removal) loses none.
func TestOnceMovedRecords(t *testing.T) {
	e := newGroupEnv(t)
	s := e.store(nil)
	p := month(time.Now().Add(-time.Hour), 100)
	ids := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}
	for i, id := range ids {
		switch i {
		case 3:
			// The fourth record's move fails at its first PutItem.
			e.fault.set(func(op string) action {
				if op == "PutItem" {
					return refuse
				}
				return send
			})
		case 6:
			// The seventh's removal from the group item fails, after
			// its PutItems.
			base := e.fault.count("PutItem")
			e.fault.set(func(op string) action {
				if op == "UpdateItem" && e.fault.count("PutItem") > base {
					return refuse
				}
				return send
			})
		}
		if _, replayed := once(t, s, "g", id, kvstore.OpTake, planUpdates(p)); replayed {
			t.Fatalf("first call with id %q replayed", id)
		}
		e.fault.set(nil)
	}
	for _, id := range ids {
		res, replayed := once(t, s, "g", id, kvstore.OpTake, planUpdates(p))
		if !replayed || !res[1].OK {
			t.Fatalf("retry of %q = %+v, replayed %v", id, res, replayed)
		}
	}
	if n := used(t, s, "g", p); n != int64(len(ids)) {
		t.Fatalf("counter at %d, want %d", n, len(ids))
	}
	if e.fault.count("PutItem") == 0 {
		t.Fatal("no record was moved to an item of its own")
	}
}

// TestOnceConcurrent: goroutines of several Stores retry one id at once;
// it counts once, and exactly one call reports that it applied it.
func TestOnceConcurrent(t *testing.T) {
	const stores, goroutines = 3, 8
	pfx := prefix(t)
	p := month(time.Now().Add(-time.Hour), 1000)
	var applied, errs atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < stores; i++ {
		s := newStore(t, newClient(t, nil), dynamostore.Config{Prefix: pfx, MaxAttempts: 32})
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := make([]kvstore.OpResult, 2)
				replayed, err := s.UpdateMultiOnce(context.Background(), "g", "one", time.Hour, kvstore.OpTake, planUpdates(p), res)
				switch {
				case err != nil:
					errs.Add(1)
					t.Log(err)
				case !replayed:
					applied.Add(1)
				}
				if err == nil && (res[1].Used != 1 || !res[1].OK) {
					t.Errorf("results %+v, want the one take's (used 1)", res)
				}
			}()
		}
	}
	wg.Wait()
	s := newStore(t, nil, dynamostore.Config{Prefix: pfx})
	if errs.Load() > 0 || applied.Load() != 1 || used(t, s, "g", p) != 1 {
		t.Fatalf("%d errors, %d calls applied, counter at %d; want 0, 1, 1", errs.Load(), applied.Load(), used(t, s, "g", p))
	}
}

// TestOnceRefundAcrossPeriod: a refund with the id of a take decided in an
// earlier period gives nothing back to the counter's current period; one
// in the same period does. Records expire after their ttl.
func TestOnceRefundAcrossPeriod(t *testing.T) {
	e := newGroupEnv(t)
	clock := fakeclock.New(t0)
	s := e.store(clock)
	p1 := month(t0.Add(-time.Hour), 10)
	once(t, s, "g", "t1", kvstore.OpTake, planUpdates(p1))
	once(t, s, "g", "t2", kvstore.OpTake, planUpdates(p1))
	if res, _ := once(t, s, "g", "t2", kvstore.OpRefund, planUpdates(p1)); res[1].Used != 1 {
		t.Fatalf("refund in the take's period = %+v, want used 1", res[1])
	}
	clock.Add(30 * 24 * time.Hour)
	p2 := month(t0.Add(30*24*time.Hour-time.Hour), 10)
	mustMulti(t, s, "g", kvstore.OpTake, planUpdates(p2))
	res, replayed := once(t, s, "g", "t1", kvstore.OpRefund, planUpdates(p2))
	if replayed || !res[1].OK || res[1].Used != 1 {
		t.Fatalf("refund of a take of the last period = %+v (replayed %v); want the counter as it stands (used 1)", res[1], replayed)
	}
	if n := used(t, s, "g", p2); n != 1 {
		t.Fatalf("counter of the new period at %d after the refund, want 1", n)
	}
	// Past its ttl a record is forgotten: the id applies again.
	clock.Add(kvstore.MaxIdempotencyTTL)
	p3 := month(t0.Add(30*24*time.Hour-time.Hour), 10)
	p3.Bounds[3] = t0.Add(100 * 24 * time.Hour).UnixMicro()
	if _, replayed := once(t, s, "g", "t1", kvstore.OpRefund, planUpdates(p3)); replayed {
		t.Fatal("a record replayed after its ttl")
	}
}

// TestOnceInvalid: ids and ttls out of range are refused before anything
// is sent; a peek is never recorded.
func TestOnceInvalid(t *testing.T) {
	e := newGroupEnv(t)
	s := e.store(nil)
	p := month(time.Now().Add(-time.Hour), 10)
	for name, tc := range map[string]struct {
		id  string
		ttl time.Duration
	}{
		"empty id":   {"", time.Hour},
		"long id":    {strings.Repeat("i", ratekit.MaxKeyLen+1), time.Hour},
		"short ttl":  {"x", time.Second - 1},
		"long ttl":   {"x", kvstore.MaxIdempotencyTTL + 1},
		"negative":   {"x", -time.Hour},
		"zero ttl":   {"x", 0},
		"binary id?": {"\xff", 0},
	} {
		_, err := s.UpdateMultiOnce(context.Background(), "g", tc.id, tc.ttl, kvstore.OpTake, planUpdates(p), make([]kvstore.OpResult, 2))
		if !errors.Is(err, kvstore.ErrInvalidIdempotency) {
			t.Errorf("%s: %v, want ErrInvalidIdempotency", name, err)
		}
	}
	if e.fault.count("UpdateItem")+e.fault.count("GetItem") != 0 {
		t.Fatal("requests sent for refused calls")
	}
	if _, err := s.UpdateMultiOnce(context.Background(), "", "x", time.Hour, kvstore.OpTake, planUpdates(p)[:1], make([]kvstore.OpResult, 1)); !errors.Is(err, kvstore.ErrInvalidOp) {
		t.Errorf("empty group: %v, want ErrInvalidOp", err)
	}
	for i := 0; i < 2; i++ {
		if _, replayed := once(t, s, "g", "peek", kvstore.OpPeek, planUpdates(p)); replayed {
			t.Fatal("a peek replayed")
		}
	}
	// A binary id is its own record.
	once(t, s, "g", "\xfe\x01", kvstore.OpTake, planUpdates(p))
	if _, replayed := once(t, s, "g", "\xfe\x01", kvstore.OpTake, planUpdates(p)); !replayed {
		t.Fatal("a binary id did not replay")
	}
}
