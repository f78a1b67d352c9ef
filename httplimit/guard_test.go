package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

// blockingLimiter answers nothing until its context ends, like a database
// that does not answer, and records the deadline of each call and how many
// calls it got.
type blockingLimiter struct {
	calls     atomic.Int64
	mu        sync.Mutex
	deadlines []time.Time
}

func (l *blockingLimiter) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	l.calls.Add(1)
	dl, _ := ctx.Deadline()
	l.mu.Lock()
	l.deadlines = append(l.deadlines, dl)
	l.mu.Unlock()
	<-ctx.Done()
	return ratekit.Decision{}, ctx.Err()
}

func (l *blockingLimiter) deadline(t *testing.T, i int) time.Time {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.deadlines) <= i {
		t.Fatalf("the limiter got %d calls, want more than %d", len(l.deadlines), i)
	}
	return l.deadlines[i]
}

// countingLimiter admits everything and counts its calls.
type countingLimiter struct{ calls atomic.Int64 }

func (l *countingLimiter) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	l.calls.Add(1)
	p := ratekit.Policy{Name: "count", Quota: 100, Window: time.Minute}
	return ratekit.Decision{Allowed: true, Quota: 100, Remaining: 99, ResetAfter: time.Minute, Policy: p}, nil
}

// A caller that gave up (its context ended before or during the limiter
// call) is not a limiter failure: no failure policy applies, the handler
// does not run and the fallback is not asked.
func TestCallerGoneIsNoFailure(t *testing.T) {
	for _, policy := range []FailurePolicy{FailOpen, FailClosed, UseFallback} {
		for _, when := range []string{"before", "during"} {
			t.Run(policy.String()+"/"+when, func(t *testing.T) {
				primary := &blockingLimiter{}
				fallback := &countingLimiter{}
				cfg := GuardConfig{Limiter: primary, OnError: policy, Timeout: time.Minute}
				if policy == UseFallback {
					cfg.Fallback = fallback
				}
				cfg.Logger = slog.New(slog.DiscardHandler)
				var ran atomic.Int64
				mw, err := Middleware(MiddlewareConfig{GuardConfig: cfg, Key: RemoteAddrKey()})
				if err != nil {
					t.Fatal(err)
				}
				h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran.Add(1) }))
				ctx, cancel := context.WithCancel(context.Background())
				r := request("198.51.100.1:1").WithContext(ctx)
				if when == "before" {
					cancel()
				} else {
					go func() {
						for primary.calls.Load() == 0 {
							time.Sleep(time.Millisecond)
						}
						cancel() // the client disconnects while the store is asked
					}()
				}
				w := serve(h, r)
				cancel()
				if n := ran.Load(); n != 0 {
					t.Errorf("the handler ran %d times for a caller that gave up (status %d)", n, w.Code)
				}
				if n := fallback.calls.Load(); n != 0 {
					t.Errorf("the fallback was asked %d times for a caller that gave up", n)
				}
				if w.Code == http.StatusOK {
					t.Errorf("status 200 for a caller that gave up")
				}
			})
		}
	}
}

// Guard.Check reports a caller that gave up with an error matching the
// caller's context error, also when the limiter was never asked.
func TestCheckCallerGoneResult(t *testing.T) {
	primary := &blockingLimiter{}
	g, err := NewGuard(GuardConfig{Limiter: primary, OnError: FailOpen, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res := g.Check(ctx, ratekit.Request{Key: "k", Cost: 1}, http.Header{})
	if res.Proceed() || res.Decided || !errors.Is(res.Err, context.Canceled) {
		t.Fatalf("result %+v, want a refusal with context.Canceled", res)
	}
	if n := primary.calls.Load(); n != 0 {
		t.Fatalf("the limiter was asked %d times for a caller that had gone", n)
	}
}

// Each limiter call ends DeadlineMargin before the caller's deadline (or
// at Timeout, whichever is earlier), so that the failure policy answers
// while the caller still listens; a short deadline gives up a tenth of its
// time at most. With UseFallback the primary gets half of the time left,
// and the fallback the rest.
func TestGuardDeadlineMargin(t *testing.T) {
	const margin = 200 * time.Millisecond
	tests := []struct {
		name    string
		timeout time.Duration
		left    time.Duration // from the call to the caller's deadline
		policy  FailurePolicy
	}{
		{"deadline before timeout", 10 * time.Second, 2500 * time.Millisecond, FailClosed},
		{"timeout before deadline", 400 * time.Millisecond, 10 * time.Second, FailClosed},
		{"no timeout", 0, 2500 * time.Millisecond, FailClosed},
		{"fallback gets time too", 10 * time.Second, 2500 * time.Millisecond, UseFallback},
		{"short deadline", 10 * time.Second, margin, FailClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			primary, fallback := &blockingLimiter{}, &blockingLimiter{}
			cfg := GuardConfig{Limiter: primary, OnError: tc.policy, Timeout: tc.timeout, DeadlineMargin: margin, Logger: slog.New(slog.DiscardHandler)}
			if tc.policy == UseFallback {
				cfg.Fallback = fallback
			}
			g, err := NewGuard(cfg)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			deadline := start.Add(tc.left)
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			res := g.Check(ctx, ratekit.Request{Key: "k", Cost: 1}, http.Header{})
			end := time.Now()
			if ctx.Err() != nil || !end.Before(deadline) {
				t.Fatalf("Check returned %v after the caller's deadline", end.Sub(deadline))
			}
			if res.Status != http.StatusServiceUnavailable || !errors.Is(res.Err, context.DeadlineExceeded) {
				t.Fatalf("result %+v, want 503 by the failure policy", res)
			}
			got := primary.deadline(t, 0)
			// The full margin unless a tenth of the time left is less
			// (Check starts within half a second of start here).
			latest := deadline.Add(-margin)
			if tc.left < 10*margin {
				latest = deadline
				if earliest := start.Add(tc.left * 8 / 10); got.Before(earliest) {
					t.Errorf("a short deadline lost %v to the margin, more than a tenth of %v", deadline.Sub(got), tc.left)
				}
			}
			if tc.timeout > 0 && end.Add(tc.timeout).Before(latest) {
				latest = end.Add(tc.timeout)
			}
			if got.IsZero() || !got.Before(latest.Add(time.Nanosecond)) {
				t.Errorf("the limiter's deadline is %v after the latest allowed", got.Sub(latest))
			}
			if tc.policy == UseFallback {
				fb := fallback.deadline(t, 0)
				if !fb.After(got) || fb.After(deadline.Add(-margin)) {
					t.Errorf("fallback deadline %v, primary %v, caller %v: want the fallback between the primary's and the caller's minus the margin", fb, got, deadline)
				}
				// The primary left the fallback at least a third of the
				// time (half on an idle machine).
				if avail := deadline.Add(-margin).Sub(start); got.After(start.Add(avail * 2 / 3)) {
					t.Errorf("the primary got until %v of %v", got.Sub(start), avail)
				}
			}
		})
	}
}

func TestNewGuardRejectsNegativeMargin(t *testing.T) {
	if _, err := NewGuard(GuardConfig{Limiter: newWindowLimiter("p", 1), OnError: FailOpen, DeadlineMargin: -1}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Fatalf("NewGuard with a negative DeadlineMargin: %v, want ErrInvalidConfig", err)
	}
}

// Behind net/http, a deadline that a server or earlier middleware set
// (http.TimeoutHandler here) bounds the limiter call the same way: the
// Guard's own 503 problem answer, not the timeout handler's.
func TestMiddlewareDeadlineMargin(t *testing.T) {
	mw, err := Middleware(MiddlewareConfig{
		GuardConfig: GuardConfig{Limiter: &blockingLimiter{}, OnError: FailClosed, Timeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)},
		Key:         RemoteAddrKey(),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := http.TimeoutHandler(mw(okHandler), 1500*time.Millisecond, "timeout handler")
	w := serve(h, request("198.51.100.1:1"))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Content-Type") != ProblemContentType {
		t.Fatalf("status %d, Content-Type %q, body %q; want the Guard's 503 problem", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
}

// fixedLimiter answers every request with d, or fails with err.
type fixedLimiter struct {
	d   ratekit.Decision
	err error
}

func (l fixedLimiter) Allow(context.Context, ratekit.Request) (ratekit.Decision, error) {
	return l.d, l.err
}

// TestRetrySpread: with RetrySpread a crowd of denials gets Retry-After
// values spread over whole seconds from the true wait to the wait plus
// the spread, never earlier, and each denying policy's t says the same.
func TestRetrySpread(t *testing.T) {
	burst := ratekit.Decision{Allowed: false, Quota: 5, RetryAfter: 2500 * time.Millisecond, ResetAfter: time.Minute,
		Policy: ratekit.Policy{Name: "burst", Quota: 5, Window: time.Minute, Algorithm: ratekit.FixedWindow}}
	daily := ratekit.Decision{Allowed: true, Quota: 100, Remaining: 40, ResetAfter: time.Hour,
		Policy: ratekit.Policy{Name: "daily", Quota: 100, Window: 24 * time.Hour, Algorithm: ratekit.FixedWindow}}
	composite := ratekit.Combine([]ratekit.Decision{burst, daily})
	g, err := NewGuard(GuardConfig{Limiter: fixedLimiter{d: composite}, OnError: FailClosed, RetrySpread: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]int{}
	for range 400 {
		h := http.Header{}
		v := g.Check(context.Background(), ratekit.Request{Key: "k", Cost: 1}, h)
		if v.Status != http.StatusTooManyRequests {
			t.Fatalf("status %d", v.Status)
		}
		ra, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64)
		if err != nil || ra < 3 || ra > 13 {
			t.Fatalf("Retry-After %q, want 3 to 13 (a 2.5s wait, up to 10s spread)", h.Get("Retry-After"))
		}
		seen[ra]++
		want := fmt.Sprintf(`"burst";r=0;t=%d, "daily";r=40;t=3600`, ra)
		if got := h.Get("RateLimit"); got != want {
			t.Fatalf("RateLimit %q, want %q", got, want)
		}
		if v.Decision.RetryAfter < burst.RetryAfter || composite.Parts[0].RetryAfter != burst.RetryAfter {
			t.Fatalf("the verdict's RetryAfter %v; the limiter's decision changed to %v", v.Decision.RetryAfter, composite.Parts[0].RetryAfter)
		}
	}
	if len(seen) != 11 {
		t.Fatalf("400 denials spread over %d Retry-After values (%v), want all 11 from 3 to 13", len(seen), seen)
	}
}

// TestUnavailableRetryAfter: a 503 from a failed limiter carries
// Retry-After, DefaultUnavailableRetryAfter unless set.
func TestUnavailableRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		set  time.Duration
		want string
	}{{0, "1"}, {2500 * time.Millisecond, "3"}} {
		g, err := NewGuard(GuardConfig{Limiter: fixedLimiter{err: errors.New("store down")}, OnError: FailClosed, UnavailableRetryAfter: tc.set, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{}
		if v := g.Check(context.Background(), ratekit.Request{Key: "k", Cost: 1}, h); v.Status != http.StatusServiceUnavailable || h.Get("Retry-After") != tc.want {
			t.Errorf("UnavailableRetryAfter %v: status %d, Retry-After %q, want 503 and %q", tc.set, v.Status, h.Get("Retry-After"), tc.want)
		}
	}
	for _, cfg := range []GuardConfig{
		{Limiter: fixedLimiter{}, OnError: FailClosed, RetrySpread: -time.Second},
		{Limiter: fixedLimiter{}, OnError: FailClosed, UnavailableRetryAfter: -time.Second},
	} {
		if _, err := NewGuard(cfg); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("NewGuard(%+v): %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// TestBadRequestWords: a 400's body says what is wrong in words for the
// client, never the key function's advice to the operator, which the Guard
// logs, once per BadRequestLogInterval with a count of the others.
func TestBadRequestWords(t *testing.T) {
	var logged []string
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		logged = append(logged, string(p))
		mu.Unlock()
		return len(p), nil
	}), nil))
	g, err := NewGuard(GuardConfig{Limiter: newWindowLimiter("p", 5), OnError: FailClosed, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	advice := fmt.Errorf("%w: X-Forwarded-For has fewer than 2 entries (ALB events: use ForwardedForKey)", ErrNoKey)
	for range 5 {
		v := g.BadRequest(advice, http.Header{})
		var p Problem
		if err := json.Unmarshal(v.Body, &p); err != nil {
			t.Fatal(err)
		}
		if v.Status != 400 || strings.Contains(p.Detail, "ForwardedFor") || !strings.Contains(p.Detail, "who sends it") || !errors.Is(v.Err, ErrNoKey) {
			t.Fatalf("400 %d, detail %q, err %v", v.Status, p.Detail, v.Err)
		}
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "use ForwardedForKey") {
		t.Fatalf("logged %q, want one line with the operator's advice", logged)
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{ratekit.ErrEmptyKey, "is empty"},
		{fmt.Errorf("%w: 600 bytes", ratekit.ErrKeyTooLong), "too long"},
		{ratekit.ErrCostExceedsQuota, "whole quota"},
		{errors.New("something else"), "cannot be counted"},
	} {
		var p Problem
		json.Unmarshal(g.BadRequest(tc.err, http.Header{}).Body, &p)
		if !strings.Contains(p.Detail, tc.want) {
			t.Errorf("%v: detail %q, want it to say %q", tc.err, p.Detail, tc.want)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestFailureLogged: a store outage is logged at once with its cause, and
// then not once per request.
func TestFailureLogged(t *testing.T) {
	for _, policy := range []FailurePolicy{FailClosed, FailOpen} {
		var lines []string
		var mu sync.Mutex
		log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			mu.Lock()
			lines = append(lines, string(p))
			mu.Unlock()
			return len(p), nil
		}), nil))
		g, err := NewGuard(GuardConfig{Limiter: fixedLimiter{err: errors.New("dial tcp 127.0.0.1:5433: connection refused")}, OnError: policy, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		for range 50 {
			g.Check(context.Background(), ratekit.Request{Key: "k", Cost: 1}, http.Header{})
		}
		if len(lines) != 1 || !strings.Contains(lines[0], "connection refused") {
			t.Errorf("%v: logged %q, want one line with the cause", policy, lines)
		}
	}
}
