package harness

import (
	"context"
	"testing"
	"time"
)

// TestBucketRoundTrip checks the histogram's resolution: every latency maps
// to a bucket whose middle is within 1/64 of it, and buckets never decrease
// as latency grows (a wrong shift or offset breaks one or the other).
func TestBucketRoundTrip(t *testing.T) {
	prev := -1
	for v := int64(0); v < 1<<40; v = v + 1 + v/97 {
		b := bucket(v)
		if b < prev {
			t.Fatalf("bucket(%d) = %d, below the previous %d", v, b, prev)
		}
		prev = b
		if b >= nBuckets {
			t.Fatalf("bucket(%d) = %d, out of range", v, b)
		}
		got := int64(value(b))
		if diff := got - v; diff*64 > v || -diff*64 > v {
			t.Fatalf("value(bucket(%d)) = %d, off by more than 1/64", v, got)
		}
	}
}

// TestMeasureCounts checks that Measure counts decisions and admissions: an
// op that admits every third decision must report a third admitted, and the
// quantiles of a sleep of 200µs must not be below it.
func TestMeasureCounts(t *testing.T) {
	r, err := Measure(context.Background(), 4, 50*time.Millisecond, func(_ context.Context, w, i int) (bool, error) {
		time.Sleep(200 * time.Microsecond)
		return i%3 == 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Decisions < 4 || r.P50 < 200*time.Microsecond || r.P99 < r.P50 {
		t.Fatalf("implausible result %+v", r)
	}
	if r.Admitted < 0.3 || r.Admitted > 0.45 {
		t.Fatalf("admitted %v, want about 1/3", r.Admitted)
	}
}

// TestMeasureInterleaved checks that side-by-side measuring keeps each op's
// figures apart: an op that sleeps twice reports the throughput that its
// own clock gives it, about half that of an op that sleeps once, and each
// op's admissions are its own. The expected ratio is what the ops measured
// of themselves, not the sleeps asked for: a loaded machine wakes a 1 ms
// sleep several milliseconds late (the ratio of a 1 ms and a 2 ms sleep
// came out at 1.15 with two yes processes beside the tests); two sleeps of
// 1 ms are late twice as often as one.
func TestMeasureInterleaved(t *testing.T) {
	var own [2]time.Duration // written by the ops, all on one goroutine
	sleeps := func(j, n int, admit bool) Op {
		return func(context.Context, int, int) (bool, error) {
			start := time.Now()
			for range n {
				time.Sleep(time.Millisecond)
			}
			own[j] += time.Since(start)
			return admit, nil
		}
	}
	rs, err := MeasureInterleaved(context.Background(), 100*time.Millisecond, []Op{sleeps(0, 1, true), sleeps(1, 2, false)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Decisions < 10 || rs[0].Decisions != rs[1].Decisions {
		t.Fatalf("implausible results %+v", rs)
	}
	want := own[1].Seconds() / own[0].Seconds()
	if want < 1.3 {
		t.Fatalf("two sleeps took %.2f times as long as one: the machine cannot tell the ops apart", want)
	}
	if r := rs[0].Throughput / rs[1].Throughput; r < want*0.85 || r > want*1.15 {
		t.Fatalf("throughput ratio %.2f of one and two 1 ms sleeps, want %.2f (their own clocks) ± 15%%", r, want)
	}
	if rs[0].Admitted != 1 || rs[1].Admitted != 0 || rs[1].P50 < 2*time.Millisecond {
		t.Fatalf("figures mixed between ops: %+v", rs)
	}
}

// TestMeasureInTurn checks that runners measured in turn each get their own
// throughput: a runner whose op sleeps twice as long must report about half
// the rate, and both must have run for the duration asked.
func TestMeasureInTurn(t *testing.T) {
	// The slow runner sleeps 1 ms twice, not 2 ms once: a loaded machine
	// wakes each sleep late by about as much, so twice as long stays about
	// twice as long.
	sleeper := func(n int) Runner {
		return OpRunner(func(context.Context, int, int) (bool, error) {
			for range n {
				time.Sleep(time.Millisecond)
			}
			return true, nil
		})
	}
	rs, err := MeasureInTurn(context.Background(), 2, 200*time.Millisecond, 20*time.Millisecond,
		[]Runner{sleeper(1), sleeper(2)})
	if err != nil {
		t.Fatal(err)
	}
	fast, slow := rs[0], rs[1]
	if fast.Throughput <= slow.Throughput*1.2 {
		t.Errorf("throughput %v for one 1ms sleep, %v for two: want about twice", fast.Throughput, slow.Throughput)
	}
	if slow.P50 < 2*time.Millisecond || fast.P50 < time.Millisecond {
		t.Errorf("p50 %v and %v, below the sleeps", fast.P50, slow.P50)
	}
	// Two workers for 200ms of two 1ms sleeps: at most 200 decisions.
	if slow.Decisions > 200 || slow.Admitted != 1 {
		t.Errorf("slow runner: %d decisions, %v admitted", slow.Decisions, slow.Admitted)
	}
}

// sinks keep each worker's allocation on the heap.
var sinks [2]*[64]byte

// TestMeasureAllocs: an op that allocates one object per decision reports
// about one allocation per decision, one that allocates none about none,
// and decisions made in another process none measured.
func TestMeasureAllocs(t *testing.T) {
	ctx := context.Background()
	one, err := Measure(ctx, 2, 30*time.Millisecond, func(_ context.Context, w, _ int) (bool, error) {
		sinks[w] = new([64]byte)
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	none, err := Measure(ctx, 2, 30*time.Millisecond, func(context.Context, int, int) (bool, error) { return true, nil })
	if err != nil {
		t.Fatal(err)
	}
	if one.Decisions < 1000 || none.Decisions < 1000 {
		t.Fatalf("implausible results %+v, %+v", one, none)
	}
	if one.Allocs < 1 || one.Allocs > 1.1 {
		t.Errorf("one allocation per decision: %v", one.Allocs)
	}
	if none.Allocs < 0 || none.Allocs > 0.1 {
		t.Errorf("no allocation per decision: %v", none.Allocs)
	}
	var s Sample
	if err := s.AddBucket(Bucket(1000), 10); err != nil {
		t.Fatal(err)
	}
	s.AddCounts(10, time.Millisecond)
	if r := s.Result(); r.Allocs >= 0 {
		t.Errorf("decisions of another process: %v allocations per decision, want negative", r.Allocs)
	}
}
