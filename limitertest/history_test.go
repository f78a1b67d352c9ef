package limitertest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/limitertest"
)

var base = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// ms returns base + n milliseconds.
func ms(n int) time.Time { return base.Add(time.Duration(n) * time.Millisecond) }

// record builds admitted ops on key "k" of cost 1 from [start, end]
// spans in milliseconds.
func record(spans ...[2]int) history {
	var h history
	for _, s := range spans {
		h = append(h, limitertest.Op{Key: "k", Cost: 1, Outcome: limitertest.Admitted, Start: ms(s[0]), End: ms(s[1])})
	}
	return h
}

type history []limitertest.Op

func (h history) check(t *testing.T, b limitertest.Bound) error { return limitertest.CheckOps(h, b) }

func TestHistoryTokenBucket(t *testing.T) {
	b := limitertest.TokenBucketBound(3, 1, 100*time.Millisecond, 0)
	// Three at once, then one per 100 ms: what a bucket of 3 refilled one
	// per 100 ms can admit.
	ok := record([2]int{0, 1}, [2]int{0, 1}, [2]int{0, 1}, [2]int{100, 101}, [2]int{200, 201})
	if err := ok.check(t, b); err != nil {
		t.Fatalf("a correct history failed: %v", err)
	}
	// A fourth inside the first millisecond is one too many.
	bad := record([2]int{0, 1}, [2]int{0, 1}, [2]int{0, 1}, [2]int{0, 1})
	if err := bad.check(t, b); !errors.Is(err, limitertest.ErrBoundExceeded) {
		t.Fatalf("four admitted at once by a bucket of 3: %v", err)
	}
	// Long overlapping intervals could have taken effect 100 ms apart: not
	// flagged.
	overlap := record([2]int{0, 1}, [2]int{0, 1}, [2]int{0, 1}, [2]int{0, 150})
	if err := overlap.check(t, b); err != nil {
		t.Fatalf("an op that may have taken effect after a refill was flagged: %v", err)
	}
}

func TestHistoryFixedWindow(t *testing.T) {
	b := limitertest.FixedWindowBound(2, time.Second, 0)
	// Two at the end of one aligned second and two at the start of the
	// next: allowed by a fixed window.
	ok := record([2]int{990, 995}, [2]int{991, 996}, [2]int{1001, 1002}, [2]int{1003, 1004})
	if err := ok.check(t, b); err != nil {
		t.Fatalf("a correct history failed: %v", err)
	}
	bad := record([2]int{100, 101}, [2]int{200, 201}, [2]int{300, 301})
	if err := bad.check(t, b); !errors.Is(err, limitertest.ErrBoundExceeded) {
		t.Fatalf("three in one window of 2: %v", err)
	}
	// Failed and denied ops never count.
	mixed := record([2]int{100, 101}, [2]int{200, 201})
	mixed = append(mixed,
		limitertest.Op{Key: "k", Cost: 1, Outcome: limitertest.Failed, Start: ms(300), End: ms(301)},
		limitertest.Op{Key: "k", Cost: 1, Outcome: limitertest.Denied, Start: ms(400), End: ms(401)},
		limitertest.Op{Key: "other", Cost: 2, Outcome: limitertest.Admitted, Start: ms(500), End: ms(501)})
	if err := mixed.check(t, b); err != nil {
		t.Fatalf("failed, denied and other keys' ops were counted: %v", err)
	}
}

func TestHistorySlidingLog(t *testing.T) {
	b := limitertest.SlidingLogBound(2, time.Second, 0)
	ok := record([2]int{0, 1}, [2]int{500, 501}, [2]int{1001, 1002}, [2]int{1502, 1503})
	if err := ok.check(t, b); err != nil {
		t.Fatalf("a correct history failed: %v", err)
	}
	// A fixed window would allow this (two at the end of one second, two
	// at the start of the next); a sliding log must not.
	bad := record([2]int{990, 991}, [2]int{992, 993}, [2]int{1001, 1002}, [2]int{1003, 1004})
	if err := bad.check(t, limitertest.SlidingLogBound(2, time.Second, 0)); !errors.Is(err, limitertest.ErrBoundExceeded) {
		t.Fatalf("four inside 14 ms under a sliding log of 2 per second: %v", err)
	}
}

// TestHistoryRecordsRealIntervals: History.Allow measures the call.
func TestHistoryRecordsRealIntervals(t *testing.T) {
	l := harness(none).New(t, limitertest.Config{Name: "h", Quota: 1, Window: time.Minute})
	var h limitertest.History
	for i := 0; i < 3; i++ {
		if _, err := h.Allow(context.Background(), l, ratekit.Request{Key: "k", Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if h.Count(limitertest.Admitted) != 1 || h.Count(limitertest.Denied) != 2 {
		t.Fatalf("recorded %+v", h.Ops())
	}
	if err := h.Check(limitertest.FixedWindowBound(1, time.Minute, 0)); err != nil {
		t.Fatal(err)
	}
	if err := h.Check(limitertest.TokenBucketBound(0, 1, time.Hour, 0)); !errors.Is(err, limitertest.ErrBoundExceeded) {
		t.Fatalf("a bound of 0 passed an admission: %v", err)
	}
}
