package signedwindow

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

var (
	burstP = ratekit.Policy{Name: "burst", Quota: 2, Window: time.Second}
	dailyP = ratekit.Policy{Name: "daily", Quota: 5, Window: time.Hour}
)

func mustComposite(tb testing.TB, clock *fakeClock, keys []Key, ps ...ratekit.Policy) *Composite {
	tb.Helper()
	c, err := NewComposite(CompositeConfig{Policies: ps, Keys: keys, Now: clock.Now})
	if err != nil {
		tb.Fatalf("NewComposite: %v", err)
	}
	return c
}

func TestCompositeConfig(t *testing.T) {
	keys := []Key{{ID: 1, Secret: secret(1)}}
	many := make([]ratekit.Policy, MaxCompositePolicies+1)
	for i := range many {
		many[i] = ratekit.Policy{Name: "p" + string(rune('a'+i)), Quota: 1, Window: time.Second}
	}
	for name, cfg := range map[string]CompositeConfig{
		"no policies":       {Keys: keys},
		"too many policies": {Policies: many, Keys: keys},
		"duplicate name":    {Policies: []ratekit.Policy{burstP, burstP}, Keys: keys},
		"bad name":          {Policies: []ratekit.Policy{burstP, {Name: "a b", Quota: 1, Window: time.Second}}, Keys: keys},
		"zero quota":        {Policies: []ratekit.Policy{burstP, {Name: "x", Quota: 0, Window: time.Second}}, Keys: keys},
		"fractional window": {Policies: []ratekit.Policy{burstP, {Name: "x", Quota: 1, Window: 1500 * time.Millisecond}}, Keys: keys},
		"window too long":   {Policies: []ratekit.Policy{burstP, {Name: "x", Quota: 1, Window: MaxWindow + time.Second}}, Keys: keys},
		"no keys":           {Policies: []ratekit.Policy{burstP, dailyP}},
		"short secret":      {Policies: []ratekit.Policy{burstP, dailyP}, Keys: []Key{{ID: 1, Secret: []byte("short")}}},
	} {
		if _, err := NewComposite(cfg); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: NewComposite = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := NewComposite(CompositeConfig{Policies: many[:MaxCompositePolicies], Keys: keys}); err != nil {
		t.Errorf("MaxCompositePolicies policies: %v", err)
	}
}

// TestCompositeWindows: each policy keeps its own window; a denial by one
// takes from none; a policy whose window ended starts a new one while the
// others keep theirs.
func TestCompositeWindows(t *testing.T) {
	clock := newClock(t0)
	c := mustComposite(t, clock, []Key{{ID: 1, Secret: secret(1)}}, burstP, dailyP)
	ctx := context.Background()
	state := ""
	step := func(want bool, burstLeft, dailyLeft int64) ratekit.Decision {
		t.Helper()
		d, err := c.Allow(ctx, ratekit.Request{Key: "ip", Cost: 1, State: state})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != want || d.Parts[0].Remaining != burstLeft || d.Parts[1].Remaining != dailyLeft {
			t.Fatalf("Allow = %+v; want Allowed %v, %d and %d left", d, want, burstLeft, dailyLeft)
		}
		state = d.State
		return d
	}
	step(true, 1, 4)
	step(true, 0, 3)
	d := step(false, 0, 3) // the burst denies; the day keeps its 3
	if d.RetryAfter != 750*time.Millisecond || d.Policy != burstP {
		t.Errorf("denial by the burst: RetryAfter %v, Policy %+v", d.RetryAfter, d.Policy)
	}
	clock.Add(time.Second)
	d = step(true, 1, 2)
	if d.Parts[1].ResetAfter != time.Hour-1250*time.Millisecond {
		t.Errorf("the day's window moved: ResetAfter %v", d.Parts[1].ResetAfter)
	}
	step(true, 0, 1)
	clock.Add(time.Second)
	step(true, 1, 0)
	d = step(false, 1, 0) // the day denies
	if d.Policy != dailyP || d.RetryAfter != time.Hour-2250*time.Millisecond || d.Parts[0].Allowed != true {
		t.Errorf("denial by the day: %+v", d)
	}
}

// TestCompositeTokenBinding: the MAC covers the policy set and the subject;
// composite and single-policy tokens are not interchangeable.
func TestCompositeTokenBinding(t *testing.T) {
	clock := newClock(t0)
	keys := []Key{{ID: 1, Secret: secret(1)}}
	c := mustComposite(t, clock, keys, burstP, dailyP)
	ctx := context.Background()
	d, err := c.Allow(ctx, ratekit.Request{Key: "ip", Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	token := d.State
	other := dailyP
	other.Quota = 6
	single := mustNew(t, Config{Name: "burst", Quota: 2, Window: time.Second, Keys: keys, Now: clock.Now})
	sd, err := single.Allow(ctx, ratekit.Request{Key: "ip", Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		l     ratekit.Limiter
		req   ratekit.Request
		wantE error
	}{
		{"another quota", mustComposite(t, clock, keys, burstP, other), ratekit.Request{Key: "ip", Cost: 1, State: token}, ErrTokenInvalid},
		{"policies reordered", mustComposite(t, clock, keys, dailyP, burstP), ratekit.Request{Key: "ip", Cost: 1, State: token}, ErrTokenInvalid},
		{"another subject", c, ratekit.Request{Key: "ip2", Cost: 1, State: token}, ErrTokenInvalid},
		{"another secret", mustComposite(t, clock, []Key{{ID: 1, Secret: secret(2)}}, burstP, dailyP), ratekit.Request{Key: "ip", Cost: 1, State: token}, ErrTokenInvalid},
		{"an unknown key ID", mustComposite(t, clock, []Key{{ID: 2, Secret: secret(1)}}, burstP, dailyP), ratekit.Request{Key: "ip", Cost: 1, State: token}, ErrTokenUnknownKey},
		{"a single limiter's token", c, ratekit.Request{Key: "ip", Cost: 1, State: sd.State}, ErrTokenUnknownVersion},
		{"a composite token to a single limiter", single, ratekit.Request{Key: "ip", Cost: 1, State: token}, ErrTokenUnknownVersion},
		{"garbage", c, ratekit.Request{Key: "ip", Cost: 1, State: "AgEC!"}, ErrTokenMalformed},
	} {
		d, err := tc.l.Allow(ctx, tc.req)
		if err != nil || !errors.Is(d.StateError, tc.wantE) || !d.Allowed {
			t.Errorf("%s: Allow = %+v, %v; want a fresh count with StateError %v", tc.name, d, err, tc.wantE)
		}
	}
	// A rotated key still verifies.
	rotated := mustComposite(t, clock, []Key{{ID: 2, Secret: secret(2)}, {ID: 1, Secret: secret(1)}}, burstP, dailyP)
	d, err = rotated.Allow(ctx, ratekit.Request{Key: "ip", Cost: 1, State: token})
	if err != nil || d.StateError != nil || d.Parts[1].Remaining != 3 {
		t.Errorf("old key after rotation: %+v, %v", d, err)
	}
}

func TestCompositeParts(t *testing.T) {
	clock := newClock(t0)
	c := mustComposite(t, clock, []Key{{ID: 1, Secret: secret(1)}}, burstP, dailyP)
	ctx := context.Background()
	for name, tc := range map[string]struct {
		parts []ratekit.Part
		want  error
	}{
		"another key":      {[]ratekit.Part{{Key: "ip", Cost: 1}, {Key: "org", Cost: 1}}, ratekit.ErrInvalidRequest},
		"one part":         {[]ratekit.Part{{Key: "ip", Cost: 1}}, ratekit.ErrInvalidRequest},
		"above a quota":    {[]ratekit.Part{{Key: "ip", Cost: 3}, {Key: "ip", Cost: 1}}, ratekit.ErrCostExceedsQuota},
		"cost 0 in a part": {[]ratekit.Part{{Key: "ip", Cost: 1}, {Key: "ip", Cost: 0}}, ratekit.ErrInvalidCost},
		"key too long":     {[]ratekit.Part{{Key: "ip", Cost: 1}, {Key: strings.Repeat("k", ratekit.MaxKeyLen+1), Cost: 1}}, ratekit.ErrKeyTooLong},
	} {
		for op, f := range map[string]func(context.Context, ratekit.Request) (ratekit.Decision, error){"Allow": c.Allow, "Peek": c.Peek, "Refund": c.Refund} {
			if _, err := f(ctx, ratekit.Request{Key: "ip", Cost: 1, Parts: tc.parts}); !errors.Is(err, tc.want) || !errors.Is(err, ratekit.ErrInvalidRequest) {
				t.Errorf("%s: %s = %v, want %v", name, op, err, tc.want)
			}
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Allow(cctx, ratekit.Request{Key: "ip", Cost: 1}); !errors.Is(err, context.Canceled) {
		t.Errorf("Allow with an ended context = %v", err)
	}
}

// TestCompositeRefund: refunds give back in the windows the token names and
// that have not ended, once per token, and nothing for a missing token.
func TestCompositeRefund(t *testing.T) {
	clock := newClock(t0)
	c := mustComposite(t, clock, []Key{{ID: 1, Secret: secret(1)}}, burstP, dailyP)
	ctx := context.Background()
	d, err := c.Allow(ctx, ratekit.Request{Key: "ip", Cost: 2})
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	charged := d.State
	clock.Add(time.Second) // the burst's window ends; the day's does not
	for i := 0; i < 2; i++ {
		d, err = c.Refund(ctx, ratekit.Request{Key: "ip", Cost: 2, State: charged})
		if err != nil || !d.Allowed || d.Parts[0].Remaining != 2 || d.Parts[1].Remaining != 5 {
			t.Fatalf("refund %d of the same token: %+v, %v; want the day's 2 back once", i+1, d, err)
		}
	}
	refunded := d.State
	d, err = c.Peek(ctx, ratekit.Request{Key: "ip", Cost: 1, State: refunded})
	if err != nil || d.State != refunded || d.Parts[1].ResetAfter != time.Hour-time.Second-250*time.Millisecond {
		t.Errorf("Peek after the refund: %+v, %v; want the same token and the day's window unmoved", d, err)
	}
	d, err = c.Refund(ctx, ratekit.Request{Key: "ip", Cost: 1})
	if err != nil || !errors.Is(d.StateError, ErrTokenMissing) || d.Parts[0].Remaining != 2 || d.Parts[1].Remaining != 5 {
		t.Errorf("refund without a token: %+v, %v", d, err)
	}
}
