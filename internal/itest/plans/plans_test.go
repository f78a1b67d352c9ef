// Package plans_test checks plans and calendar periods across processes:
// several OS processes (this test binary, re-executed as workers) decide
// against the same keys with one planned limiter each (durable.Planned on
// PostgreSQL, tokenbucket.Planned on Redis and on DynamoDB), and the parent
// asserts
// exactly, per period:
//
//   - admitted == min(demand, quota left) in every phase, summed over the
//     processes, with plan changes mid-period (upgrade, downgrade below what
//     was used, refunds, an upgrade again);
//   - what Usage (read back by another process) and PeriodUsage (the billing
//     records, on PostgreSQL and DynamoDB) report == the admitted costs
//     less the refunds;
//   - no period above its quota, and every decision counted in the period
//     the database clock was in.
//
// # Live on the database clock, and how
//
// Every case crosses a period boundary live: the boundary is placed a few
// seconds after the scenario starts, phases run before it, the parent waits
// for it, and phases run after it, on the database's clock_timestamp() as in
// production. The workers see the real time; the period is what moves. With
// user-facing means only (durable's test hook that shifts the bounds a
// client computes, pgengine.SetPeriodClock, is internal to the durable
// module):
//
//   - Month ends (a 31st anchor into a leap February and back to the 31st of
//     March; a 31st anchor at 09:00 into a common February): the period's
//     Location is a fixed zone whose offset makes its wall clock read
//     2024-02-29 00:00 (or 2025-02-28 09:00) at the boundary's real instant
//     (timeMachine). A fixed zone has one offset, so ratekit.Period's
//     wall-clock arithmetic in it is UTC's on that date, moved; the database
//     sees the real instants.
//   - Daylight saving: Period resolves wall clocks with the offsets a day
//     either side, so a real zone's change cannot be moved to today that way.
//     The live cases run in a zone built with time.LoadLocationFromTZData
//     whose offset changes as Berlin's does in spring (+1 h to +2 h, a Day
//     period anchored at 02:30 in the gap: 23 h 30 min days on both sides) or
//     New York's in autumn (−4 h to −5 h, anchored at 01:30 in the repeated
//     hour: a 24 h day, then a 25 h one), at an instant seconds from now
//     (dstChange).
//
// The real Europe/Berlin and America/New_York changes (2026-03-29,
// 2026-11-01), the real February dates and calendar days of the changes
// are pure Bounds tables (TestPeriodBoundsTables): it pins their bounds and
// checks that the zones run live reproduce their lengths.
//
// A worker reports for each decision the end of the period it was counted
// in (its clock plus the quota part's ResetAfter, computed by the
// database), and the parent attributes it to the nearest expected period
// end, so a phase that strays over the boundary (a slow machine) is seen,
// and the scenario runs again with a longer lead.
//
// Backends: PostgreSQL (durable.Planned), Redis (tokenbucket.Planned over
// redisstore, on Redis's clock) and DynamoDB (tokenbucket.Planned over
// dynamostore with Group, on each worker's clock, which DynamoDB lacks),
// each skipped outside CI when its server is missing. The workers see a
// planned limiter only through the planned interface (Allow, Refund,
// Usage, and Periods for billing records), and the scenarios differ only
// where the limiters' documented semantics do: on redisstore
// tokenbucket.Planned ignores Request.IdempotencyKey, so the refunds after
// the boundary that carry the keys of charges made before it lower the new
// period's count instead of giving nothing back (and the phases that
// follow expect what that leaves), and it keeps no billing records, so
// Periods is not checked. dynamostore keeps both, idempotency records and
// period history, and is held to PostgreSQL's figures. The plans' burst keeps one shape
// across plans, so tokenbucket's new-shape-starts-full rule never applies.
package plans_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(runWorker())
	}
	pgstoretest.Main(m, testenv.CheckLeaks)
}

// workers is how many processes decide at once.
const workers = 4

// scenario is a period whose boundary the check crosses live.
type scenario struct {
	name string
	// spec returns the quota's period (Quota not set) whose boundary is at
	// boundary, a whole second.
	spec func(boundary time.Time) (planSpec, error)
	// before and after are the lengths of the periods either side.
	before, after time.Duration
	// real names the rows of boundsTable (real zones and dates) whose
	// lengths the periods either side reproduce.
	real [2]string
}

// period returns the Period of sc's quota for boundary.
func (sc scenario) period(boundary time.Time) (ratekit.Period, error) {
	s, err := sc.spec(boundary)
	if err != nil {
		return ratekit.Period{}, err
	}
	p, err := s.plan()
	if err != nil {
		return ratekit.Period{}, err
	}
	return p.Policies[1].Period, nil
}

// anchored returns a monthly planSpec in zone whose anchor reads wall.
func anchored(unit ratekit.PeriodUnit, zone zoneSpec, wall func(*time.Location) time.Time) (planSpec, error) {
	loc, err := zone.location()
	if err != nil {
		return planSpec{}, err
	}
	return planSpec{Unit: unit, Zone: zone, AnchorUS: wall(loc).UnixMicro()}, nil
}

var scenarios = []scenario{
	{
		name: "31st anchor into a leap February",
		spec: func(b time.Time) (planSpec, error) {
			return anchored(ratekit.Month, timeMachine(time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC), b),
				func(loc *time.Location) time.Time { return time.Date(2024, 1, 31, 0, 0, 0, 0, loc) })
		},
		before: 29 * 24 * time.Hour, after: 31 * 24 * time.Hour,
		real: [2]string{"31st anchor, leap February", "31st anchor, after a leap February"},
	},
	{
		name: "31st anchor at 09:00 into a common February",
		spec: func(b time.Time) (planSpec, error) {
			return anchored(ratekit.Month, timeMachine(time.Date(2025, 2, 28, 9, 0, 0, 0, time.UTC), b),
				func(loc *time.Location) time.Time { return time.Date(2025, 1, 31, 9, 0, 0, 0, loc) })
		},
		before: 28 * 24 * time.Hour, after: 31 * 24 * time.Hour,
		real: [2]string{"31st anchor, common February", "31st anchor, after a common February"},
	},
	{
		// The change is at the boundary: the anchor's wall clock, half an
		// hour into the gap, resolves to the gap's end.
		name: "spring forward as in Berlin, day anchored in the gap",
		spec: func(b time.Time) (planSpec, error) {
			return anchored(ratekit.Day, dstChange(b, 3600, 7200),
				func(*time.Location) time.Time { return b.Add(30*time.Minute - 7*24*time.Hour) })
		},
		before: 23*time.Hour + 30*time.Minute, after: 23*time.Hour + 30*time.Minute,
		real: [2]string{"Berlin, day anchored in the spring-forward gap", "Berlin, day after the gap"},
	},
	{
		// The change is half an hour after the boundary: the anchor's wall
		// clock occurs at the boundary and again an hour later.
		name: "fall back as in New York, day anchored in the repeated hour",
		spec: func(b time.Time) (planSpec, error) {
			return anchored(ratekit.Day, dstChange(b.Add(30*time.Minute), -4*3600, -5*3600),
				func(*time.Location) time.Time { return b.Add(-7 * 24 * time.Hour) })
		},
		before: 24 * time.Hour, after: 25 * time.Hour,
		real: [2]string{"New York, day before the fall-back", "New York, day anchored in the repeated hour"},
	},
}

// errCrossed reports a phase that was meant to end before the boundary and
// did not: the scenario runs again with a longer lead.
var errCrossed = errors.New("a phase meant for before the boundary ran after it")

func TestPlansAcrossProcesses(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			env := b.setup(t) // skips outside CI when the server is missing
			ws := make([]*worker, workers)
			for i := range ws {
				ws[i] = startWorker(t, b, env)
			}
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					for lead := 5 * time.Second; ; lead *= 2 {
						err := check(t, b, ws, sc, lead)
						if err == nil {
							return
						}
						if !errors.Is(err, errCrossed) || lead >= 20*time.Second {
							t.Fatal(err)
						}
						t.Logf("%v with a lead of %v; again with %v", err, lead, 2*lead)
					}
				})
			}
		})
	}
}

// expect is what a phase must give: requests admitted over all workers,
// units given back, and the quota's Used and Remaining after it.
type expect struct {
	admit, refunded, used, left int64
}

// run is one scenario's attempt.
type run struct {
	t        *testing.T
	backend  backend
	ws       []*worker
	key      string
	spec     planSpec
	periods  [2][2]time.Time // the periods before and after the boundary
	boundary time.Time
	phase    int
}

// check runs sc once on backend be's workers with its boundary lead from
// now.
func check(t *testing.T, be backend, ws []*worker, sc scenario, lead time.Duration) error {
	b := make([]byte, 6)
	rand.Read(b)
	r := &run{t: t, backend: be, ws: ws, key: strings.Join(strings.Fields(sc.name), "-") + "-" + hex.EncodeToString(b)}
	r.boundary = time.Now().Add(lead).Truncate(time.Second)
	var err error
	if r.spec, err = sc.spec(r.boundary); err != nil {
		return err
	}
	p, err := sc.period(r.boundary)
	if err != nil {
		return err
	}
	s0, e0 := p.Bounds(r.boundary.Add(-time.Microsecond))
	s1, e1 := p.Bounds(r.boundary)
	if !e0.Equal(r.boundary) || !s1.Equal(r.boundary) || e0.Sub(s0) != sc.before || e1.Sub(s1) != sc.after {
		return fmt.Errorf("periods %v to %v and %v to %v, want %v and %v either side of %v", s0, e0, s1, e1, sc.before, sc.after, r.boundary)
	}
	r.periods = [2][2]time.Time{{s0, e0}, {s1, e1}}
	const small, large = 10, 20 // the plans' quotas: "free" and "pro"

	// Before the boundary, in period 0 (n is per worker when the step is
	// spread): 16 calls against 10 admit 10; an upgrade to 20 admits 10
	// more; a downgrade to 10 (20 used) admits none and leaves 0
	// remaining, not less; 5 refunds leave 15 used, still above 10; an
	// upgrade to 20 admits 4 charges with idempotency keys, then 1 of 8.
	steps := []struct {
		op          string
		quota       int64
		n, cost     int64
		idem        string
		on          int // -1: spread over the workers; otherwise one worker
		afterBounds bool
		want        expect
		// untied, when set, replaces want on a backend whose refunds are
		// not tied to their charges (backend.untiedRefunds).
		untied *expect
	}{
		{op: opAllow, quota: small, n: 4, cost: 1, on: -1, want: expect{admit: 10, used: 10, left: 0}},
		{op: opAllow, quota: large, n: 4, cost: 1, on: -1, want: expect{admit: 10, used: 20, left: 0}},
		{op: opAllow, quota: small, n: 2, cost: 1, on: -1, want: expect{admit: 0, used: 20, left: 0}},
		{op: opRefund, quota: small, n: 5, cost: 1, on: 1, want: expect{refunded: 5, used: 15, left: 0}},
		{op: opAllow, quota: large, n: 1, cost: 1, idem: "charge", on: -1, want: expect{admit: 4, used: 19, left: 1}},
		{op: opAllow, quota: large, n: 2, cost: 1, on: -1, want: expect{admit: 1, used: 20, left: 0}},
		// After the boundary, in period 1, on the large plan: 16 calls of
		// cost 2 admit 10 (20 units); refunds that carry the idempotency
		// keys of the charges made before the boundary give nothing back
		// on durable (its records tie them to the ended period); a refund
		// of 3 does, and 3 of 8 calls are admitted again. tokenbucket's
		// Planned ignores the keys and refunds into the current period:
		// the 4 late refunds lower it to 16, the refund of 3 to 13, and 7
		// of 8 calls are admitted again.
		{op: opAllow, quota: large, n: 4, cost: 2, on: -1, afterBounds: true, want: expect{admit: 10, used: 20, left: 0}},
		{op: opRefund, quota: large, n: 1, cost: 1, idem: "charge", on: -1, afterBounds: true,
			want: expect{used: 20, left: 0}, untied: &expect{refunded: 4, used: 16, left: 4}},
		{op: opRefund, quota: large, n: 1, cost: 3, on: 2, afterBounds: true,
			want: expect{refunded: 3, used: 17, left: 3}, untied: &expect{refunded: 3, used: 13, left: 7}},
		{op: opAllow, quota: large, n: 2, cost: 1, on: -1, afterBounds: true,
			want: expect{admit: 3, used: 20, left: 0}, untied: &expect{admit: 7, used: 20, left: 0}},
	}
	var ledger [2]int64 // admitted units less refunded units, per period
	waited := false
	for i, st := range steps {
		r.phase = i
		want := st.want
		if r.backend.untiedRefunds && st.untied != nil {
			want = *st.untied
		}
		if st.afterBounds && !waited {
			if time.Now().After(r.boundary) {
				return fmt.Errorf("%w (the phases before it ended %v after it)", errCrossed, time.Since(r.boundary))
			}
			time.Sleep(time.Until(r.boundary) + 300*time.Millisecond)
			waited = true
		}
		period := 0
		if st.afterBounds {
			period = 1
		}
		spec := r.spec
		spec.Quota = st.quota
		outs, err := r.send(command{Op: st.op, Key: r.key, Plan: spec, N: int(st.n), Cost: st.cost, Idem: st.idem}, st.on)
		if err != nil {
			return fmt.Errorf("phase %d: %w", i, err)
		}
		if st.op == opAllow {
			var admitted int64
			for _, o := range outs {
				got, err := r.attribute(o)
				if err != nil {
					return fmt.Errorf("phase %d: %w", i, err)
				}
				if got != period {
					if period == 0 {
						return fmt.Errorf("phase %d: %w", i, errCrossed)
					}
					return fmt.Errorf("phase %d: a decision after the boundary was counted in the period before it", i)
				}
				if o.Admitted {
					admitted++
				}
			}
			if admitted != want.admit {
				return fmt.Errorf("phase %d: %d requests of cost %d against a quota of %d over %d processes: %d admitted, want exactly %d",
					i, len(outs), st.cost, st.quota, workers, admitted, want.admit)
			}
			ledger[period] += admitted * st.cost
		}
		ledger[period] -= want.refunded
		if !st.afterBounds && time.Until(r.boundary) < 500*time.Millisecond {
			return fmt.Errorf("phase %d: %w", i, errCrossed)
		}
		// Usage, read back by one process for all of them.
		u, err := r.ws[i%len(r.ws)].do(command{Op: opUsage, Key: r.key, Plan: spec})
		if err != nil {
			return fmt.Errorf("phase %d: usage: %w", i, err)
		}
		if u.Usage != (usageLine{Quota: st.quota, Used: want.used, Remaining: want.left}) || u.Usage.Used != ledger[period] {
			return fmt.Errorf("phase %d: usage %+v, want quota %d, used %d (the admitted costs less refunds: %d), remaining %d",
				i, u.Usage, st.quota, want.used, ledger[period], want.left)
		}
	}
	// The billing records: the ended period moved to period_usage, the
	// current one in its counter row, with the exact bounds.
	spec := r.spec
	spec.Quota = large
	rep, err := r.ws[3%len(r.ws)].do(command{Op: opPeriods, Key: r.key, Plan: spec,
		FromUS: s0.Add(-time.Hour).UnixMicro(), ToUS: e1.UnixMicro()})
	const wall = "2006-01-02 15:04:05"
	if errors.Is(err, errNoPeriods) {
		t.Logf("%d processes, boundary crossed live at %v: wall clock [%v, %v) used %d, [%v, %v) used %d (no billing records)",
			len(ws), r.boundary.UTC().Format(time.RFC3339), s0.Format(wall), e0.Format(wall), ledger[0],
			s1.Format(wall), e1.Format(wall), ledger[1])
		return nil
	}
	if err != nil {
		return fmt.Errorf("periods: %w", err)
	}
	want := []periodLine{{s0.UnixMicro(), e0.UnixMicro(), ledger[0]}, {s1.UnixMicro(), e1.UnixMicro(), ledger[1]}}
	if fmt.Sprint(rep.Periods) != fmt.Sprint(want) || ledger != [2]int64{20, 20} {
		return fmt.Errorf("billing records %+v, want %+v (admitted less refunded per period: %v)", rep.Periods, want, ledger)
	}
	t.Logf("%d processes, boundary crossed live at %v: wall clock [%v, %v) billed %d, [%v, %v) billed %d",
		len(ws), r.boundary.UTC().Format(time.RFC3339), s0.Format(wall), e0.Format(wall), ledger[0],
		s1.Format(wall), e1.Format(wall), ledger[1])
	return nil
}

// send sends c to worker on, or splits it over all workers (each running
// c.N requests, with idempotency keys of its own), and returns every
// outcome.
func (r *run) send(c command, on int) ([]outcome, error) {
	if on >= 0 {
		rep, err := r.ws[on].do(c)
		return rep.Outcomes, err
	}
	var mu sync.Mutex
	var all []outcome
	var firstErr error
	var wg sync.WaitGroup
	for i, w := range r.ws {
		wc := c
		if c.Idem != "" {
			wc.Idem = fmt.Sprintf("%s-w%d", c.Idem, i)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := w.do(wc)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			all = append(all, rep.Outcomes...)
		}()
	}
	wg.Wait()
	return all, firstErr
}

// attribute returns the period (0 before the boundary, 1 after) whose end
// o reports, allowing for the time between the database's decision and the
// worker's clock reading.
func (r *run) attribute(o outcome) (int, error) {
	end := time.UnixMicro(o.EndUS)
	for i, p := range r.periods {
		if d := end.Sub(p[1]); d > -time.Minute && d < time.Minute {
			return i, nil
		}
	}
	return 0, fmt.Errorf("a decision reports a period ending at %v, neither %v nor %v", end, r.periods[0][1], r.periods[1][1])
}
