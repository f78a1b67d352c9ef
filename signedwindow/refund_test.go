package signedwindow

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

// refund calls l.Refund for subject with state and cost, failing on error.
func refund(t *testing.T, l *Limiter, subject, state string, cost int64) ratekit.Decision {
	t.Helper()
	d, err := l.Refund(context.Background(), ratekit.Request{Key: subject, Cost: cost, State: state})
	if err != nil {
		t.Fatalf("Refund: %v", err)
	}
	if !d.Allowed {
		t.Fatalf("Refund not allowed: %+v", d)
	}
	return d
}

// windowOf returns the window start (Unix seconds) and count of a token l
// accepts for subject, failing when it does not.
func windowOf(t *testing.T, l *Limiter, subject, state string) (int64, int64) {
	t.Helper()
	tok, err := l.VerifyToken(state, subject)
	if err != nil {
		t.Fatalf("VerifyToken(%q): %v", state, err)
	}
	return tok.WindowStart.Unix(), tok.Count
}

// TestRefundFailingCallsWithoutToken replays, on a fake clock, the
// middleware attack on a 5-a-minute policy with a replay cache: the client
// sends no token on the calls it can make fail (the handler refunds them
// with the request's state, as httplimit.RequestFromContext hands it over) and
// sends the token it received last on the others. With the replay cache
// every call of the 40 seconds is counted in the one window the subject
// started, so at most 5 calls succeed.
func TestRefundFailingCallsWithoutToken(t *testing.T) {
	for _, failState := range []string{"", "junk", "other-subject", "other-policy"} {
		t.Run(fmt.Sprintf("state=%q", failState), func(t *testing.T) {
			clock := newClock(t0)
			cfg := testConfig(clock)
			cfg.Quota = 5
			cfg.ReplayCacheSize = 64
			l := mustNew(t, cfg)
			ocfg := cfg
			ocfg.Name = "other-policy"
			other := mustNew(t, ocfg)

			bad := failState
			switch failState {
			case "other-subject":
				bad = allow(t, l, bob, "").State
			case "other-policy":
				bad = allow(t, other, alice, "").State
			}
			var (
				last      string // the token the client received last
				succeeded int
				start     = int64(-1)
			)
			for step := 0; step < 80; step++ { // 80 calls, one every 0.5 s
				if step%2 == 0 {
					// A call the client makes fail: no (or a useless) token.
					d := allow(t, l, alice, bad)
					if d.Allowed {
						d = refund(t, l, alice, bad, 1)
					}
					last = d.State
				} else {
					d := allow(t, l, alice, last)
					if d.Allowed {
						succeeded++
					}
					last = d.State
				}
				s, _ := windowOf(t, l, alice, last)
				if start < 0 {
					start = s
				}
				if s != start {
					t.Fatalf("call %d: token for the window starting at %d, want %d", step, s, start)
				}
				clock.Add(500 * time.Millisecond)
			}
			if succeeded > 5 {
				t.Fatalf("%d successful calls in 40 s, want at most 5", succeeded)
			}
		})
	}
}

// TestRefundKeepsWindow checks that a refund whose token is not accepted
// gives nothing back and does not move the subject's window: with the replay
// cache it answers as Peek does (the remembered window and its count);
// without the cache it answers as Peek does too (a fresh window at count 0,
// no better than sending no token at all).
func TestRefundKeepsWindow(t *testing.T) {
	for _, cached := range []bool{false, true} {
		for _, kind := range []string{"missing", "junk", "other subject", "other policy", "stale window", "expired", "future", "unknown key"} {
			t.Run(fmt.Sprintf("cache=%v/%s", cached, kind), func(t *testing.T) {
				clock := newClock(t0)
				cfg := testConfig(clock)
				if cached {
					cfg.ReplayCacheSize = 64
				}
				l := mustNew(t, cfg)
				ocfg := cfg
				ocfg.Name = "other-policy"
				other := mustNew(t, ocfg)
				kcfg := cfg
				kcfg.Keys = []Key{{ID: 9, Secret: secret(9)}}
				otherKey := mustNew(t, kcfg)

				clock.Add(30 * time.Second)
				now := clock.Now().Unix()
				state := ""
				for range 3 {
					state = allow(t, l, alice, state).State
				}
				wantErr := map[string]error{
					"missing":       ErrTokenMissing,
					"junk":          ErrTokenMalformed,
					"other subject": ErrTokenInvalid,
					"other policy":  ErrTokenInvalid,
					"stale window":  ErrTokenStaleWindow,
					"expired":       ErrTokenExpired,
					"future":        ErrTokenFuture,
					"unknown key":   ErrTokenUnknownKey,
				}[kind]
				bad := map[string]string{
					"missing":       "",
					"junk":          "junk",
					"other subject": tokenAt(l, now, 3, bob),
					"other policy":  tokenAt(other, now, 0, alice),
					"stale window":  tokenAt(l, now-60, 1, alice),
					"expired":       expiringToken(l, now-10, 1, 5, alice),
					"future":        tokenAt(l, now+3600, 0, alice),
					"unknown key":   tokenAt(otherKey, now, 0, alice),
				}[kind]

				peek, err := l.Peek(context.Background(), ratekit.Request{Key: alice, Cost: 1, State: bad})
				if err != nil {
					t.Fatal(err)
				}
				d := refund(t, l, alice, bad, 1)
				if !errors.Is(d.StateError, wantErr) {
					t.Fatalf("Refund StateError %v, want %v", d.StateError, wantErr)
				}
				if d.Remaining != peek.Remaining || d.ResetAfter != peek.ResetAfter {
					t.Fatalf("Refund %+v; want what Peek reports, %+v", d, peek)
				}
				s, c := windowOf(t, l, alice, d.State)
				if cached {
					// The remembered window, with nothing given back.
					if s != now || c != 3 {
						t.Fatalf("refund token: window %d count %d, want %d count 3", s, c, now)
					}
					if a := allow(t, l, alice, d.State); a.Allowed {
						t.Fatalf("Allow with the refund's token admitted: %+v", a)
					}
					if a := allow(t, l, alice, ""); a.Allowed {
						t.Fatalf("Allow without a token admitted: %+v", a)
					}
				} else if s != now || c != 0 {
					t.Fatalf("refund token: window %d count %d, want a fresh one at %d", s, c, now)
				}
				// The subject's own token is untouched either way.
				if a := allow(t, l, alice, state); a.Allowed {
					t.Fatalf("Allow with the subject's token admitted after the refund: %+v", a)
				}
			})
		}
	}
}

// expiringToken returns a token for the window starting at start with count
// units and an expiry ttl seconds after start (shorter than the window, as
// an instance configured with a shorter window issues).
func expiringToken(l *Limiter, start, count, ttl int64, subject string) string {
	sc := l.keys.signing.get(purposeToken)
	defer l.keys.signing.put(purposeToken, sc)
	tf := tokenFields{kid: l.keys.signing.id, start: start, count: count, ttl: ttl}
	body := tf.appendBody(nil)
	sc.mac(&tf.mac, body, l.name, subject)
	return b64.EncodeToString(append(body, tf.mac[:]...))
}

// TestRefundAcrossRollOver charges a call in one window and refunds it after
// that window ended, when the subject already uses up the next one: the
// refund must not give the unit back in the new window, whether the handler
// refunds with the token the call carried, the token Allow returned, or no
// token at all.
func TestRefundAcrossRollOver(t *testing.T) {
	for _, cached := range []bool{false, true} {
		for _, with := range []string{"request token", "decision token", "no token"} {
			t.Run(fmt.Sprintf("cache=%v/%s", cached, with), func(t *testing.T) {
				clock := newClock(t0)
				cfg := testConfig(clock)
				if cached {
					cfg.ReplayCacheSize = 64
				}
				l := mustNew(t, cfg)

				first := allow(t, l, alice, "")
				reqState := first.State
				if with == "no token" {
					reqState = ""
				}
				slow := allow(t, l, alice, reqState) // the call whose work will fail
				refundState := reqState
				if with == "decision token" {
					refundState = slow.State
				}

				clock.Add(time.Minute) // the first window ends
				state := ""
				for range 3 {
					d := allow(t, l, alice, state)
					if !d.Allowed {
						t.Fatalf("new window: %+v", d)
					}
					state = d.State
				}
				s2, _ := windowOf(t, l, alice, state)

				for range 3 {
					d := refund(t, l, alice, refundState, 1)
					if d.StateError == nil {
						t.Fatalf("late refund accepted its token: %+v", d)
					}
					s, c := windowOf(t, l, alice, d.State)
					if !cached {
						// No memory: the answer is a fresh window, what a
						// client gets by sending no token.
						if s != clock.Now().Unix() || c != 0 {
							t.Fatalf("late refund token: window %d count %d, want a fresh one", s, c)
						}
						continue
					}
					if s != s2 || c != 3 {
						t.Fatalf("late refund token: window %d count %d, want the remembered %d count 3", s, c, s2)
					}
					if a := allow(t, l, alice, d.State); a.Allowed {
						t.Fatalf("Allow after a late refund admitted: %+v", a)
					}
				}
				if a := allow(t, l, alice, state); a.Allowed {
					t.Fatalf("Allow with the new window's token admitted: %+v", a)
				}
			})
		}
	}
}

// TestRefundIdempotentToken refunds with the same accepted token several
// times: the unit comes back once, with and without the replay cache.
func TestRefundIdempotentToken(t *testing.T) {
	for _, cached := range []bool{false, true} {
		t.Run(fmt.Sprintf("cache=%v", cached), func(t *testing.T) {
			clock := newClock(t0)
			cfg := testConfig(clock)
			if cached {
				cfg.ReplayCacheSize = 64
			}
			l := mustNew(t, cfg)
			state := ""
			for range 3 {
				state = allow(t, l, alice, state).State
			}
			for i := range 4 {
				d := refund(t, l, alice, state, 1)
				if _, c := windowOf(t, l, alice, d.State); c != 2 || d.Remaining != 1 {
					t.Fatalf("refund %d: count %d remaining %d, want 2 and 1", i, c, d.Remaining)
				}
			}
			if cached {
				if d := allow(t, l, alice, ""); !d.Allowed || d.Remaining != 0 {
					t.Fatalf("Allow without token after refunds: %+v", d)
				}
				if d := allow(t, l, alice, ""); d.Allowed {
					t.Fatalf("second Allow without token after refunds: %+v", d)
				}
			}
		})
	}
}

// TestRefundOtherSubjectsWindow checks that a refund for one subject never
// touches another subject's remembered window.
func TestRefundOtherSubjectsWindow(t *testing.T) {
	clock := newClock(t0)
	cfg := testConfig(clock)
	cfg.ReplayCacheSize = 64
	l := mustNew(t, cfg)
	for range 3 {
		allow(t, l, bob, "")
	}
	a := allow(t, l, alice, "")
	for _, st := range []string{"", a.State} {
		refund(t, l, alice, st, 1)
	}
	if d := allow(t, l, bob, ""); d.Allowed {
		t.Fatalf("bob admitted after alice's refunds: %+v", d)
	}
}

// TestRefundWindowOrder refunds with accepted tokens of windows other than
// the remembered one: a token of an earlier window is refunded where Allow
// charged it (the remembered window, as a replay), and a token of a later
// window (from another instance) gets its refund in its own window without
// moving the window this instance counts the subject in.
func TestRefundWindowOrder(t *testing.T) {
	clock := newClock(t0)
	cfg := testConfig(clock)
	cfg.ReplayCacheSize = 64
	l := mustNew(t, cfg)
	now := t0.Unix()

	// The remembered window starts at now and is used up.
	for range 3 {
		allow(t, l, alice, "")
	}
	clock.Add(10 * time.Second)

	// A token of an earlier window (still valid): counted as a replay of the
	// remembered window by Allow, and refunded there.
	early := tokenAt(l, now-5, 1, alice)
	d := refund(t, l, alice, early, 1)
	if s, c := windowOf(t, l, alice, d.State); s != now || c != 2 || !errors.Is(d.StateError, ErrTokenReplayed) {
		t.Fatalf("refund of an earlier window's token: window %d count %d (%v), want %d count 2, replayed", s, c, d.StateError, now)
	}
	if a := allow(t, l, alice, ""); !a.Allowed || a.Remaining != 0 {
		t.Fatalf("Allow after the refund: %+v", a)
	}

	// A token of a later window, from another instance.
	later := tokenAt(l, now+8, 3, alice)
	d = refund(t, l, alice, later, 1)
	if s, c := windowOf(t, l, alice, d.State); s != now+8 || c != 2 || d.StateError != nil {
		t.Fatalf("refund of a later window's token: window %d count %d (%v), want %d count 2", s, c, d.StateError, now+8)
	}
	// Requests without a token are still counted in the remembered window,
	// which is used up.
	if a := allow(t, l, alice, ""); a.Allowed {
		t.Fatalf("Allow without a token after the later refund admitted: %+v", a)
	}
	if s, _ := windowOf(t, l, alice, allow(t, l, alice, "").State); s != now {
		t.Fatalf("remembered window moved to %d, want %d", s, now)
	}
}

// TestRefundChargedRequestToken follows the middleware recipe with a replay
// cache: the handler refunds with the state the charged request carried,
// which Allow's answer made a replay. The unit comes back exactly once per
// refund, in the same window.
func TestRefundChargedRequestToken(t *testing.T) {
	clock := newClock(t0)
	cfg := testConfig(clock)
	cfg.ReplayCacheSize = 64
	l := mustNew(t, cfg)
	state := allow(t, l, alice, "").State // count 1
	for i := range 5 {
		d := allow(t, l, alice, state) // count 2
		if !d.Allowed || d.Remaining != 1 {
			t.Fatalf("call %d: %+v", i, d)
		}
		r := refund(t, l, alice, state, 1)
		s, c := windowOf(t, l, alice, r.State)
		if s != t0.Unix() || c != 1 || !errors.Is(r.StateError, ErrTokenReplayed) {
			t.Fatalf("refund %d: window %d count %d (%v), want %d count 1, replayed", i, s, c, r.StateError, t0.Unix())
		}
	}
}

// TestRefundWithoutEntry refunds without a token when the replay cache
// remembers no window for the subject: the answer is a fresh window at
// count 0, as Peek's, and the cache records nothing, so the window a later
// request starts is the one the subject is counted in, and the refund's
// older token is counted there as a replay.
func TestRefundWithoutEntry(t *testing.T) {
	clock := newClock(t0)
	cfg := testConfig(clock)
	cfg.ReplayCacheSize = 64
	l := mustNew(t, cfg)

	r := refund(t, l, alice, "", 1)
	if s, c := windowOf(t, l, alice, r.State); s != t0.Unix() || c != 0 {
		t.Fatalf("refund token: window %d count %d, want %d count 0", s, c, t0.Unix())
	}
	clock.Add(10 * time.Second)
	later := t0.Unix() + 10
	for range 3 {
		if d := allow(t, l, alice, ""); !d.Allowed {
			t.Fatalf("Allow without token: %+v", d)
		}
	}
	d := allow(t, l, alice, r.State)
	if d.Allowed || !errors.Is(d.StateError, ErrTokenReplayed) {
		t.Fatalf("Allow with the earlier refund token: %+v, want a denied replay", d)
	}
	if s, _ := windowOf(t, l, alice, d.State); s != later {
		t.Fatalf("counted in window %d, want %d", s, later)
	}
}
