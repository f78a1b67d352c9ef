package limitertest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

// CompositeHarness describes a composite [ratekit.Limiter] under test: one
// limiter over several policies, whose Decision carries one part per policy
// (see [ratekit.Decision.Parts]). New and ratekit.Algorithm are required.
type CompositeHarness struct {
	// New returns a new composite limiter over policies, in their order:
	// Decision.Parts[i] and Request.Parts[i] belong to policies[i]. The
	// names of the policies differ. Each call must return a limiter whose
	// keys are separate from those of every limiter New returned before.
	New func(t testing.TB, policies []Config) ratekit.Limiter

	// NewClients, when not nil, returns n limiters over policies that share
	// one fresh set of keys (one prefix or namespace, separate from every
	// other limiter's) and each reach the store through a client or
	// connection pool of their own, as n instances of a function would.
	// The concurrency check then spreads its goroutines over them. Nil
	// means the check's goroutines share one limiter from New.
	NewClients func(t testing.TB, policies []Config, n int) []ratekit.Limiter

	// Advance moves the limiter's clock forward by d; nil means a real
	// clock. The composite checks use windows of an hour or more and do
	// not move time, so they pass on either (on a real clock, checks of
	// windows start clear of the hour: see [CompositeChecks]); the field
	// mirrors [Harness.Advance] so that one clock serves both suites.
	Advance func(d time.Duration)

	// ratekit.Algorithm selects the counting rules of every policy, as in [Harness].
	Algorithm ratekit.Algorithm

	// ClientState reports that the limiter keeps its state in the client
	// (Decision.State must come back as Request.State). The concurrency
	// check then counts each client's admissions on its own.
	ClientState bool

	// SameKeyParts reports that the limiter accepts Request.Parts only
	// with every part's Key equal to Request.Key (a client-carried token
	// is bound to one subject). The checks then give parts different
	// costs but never different keys.
	SameKeyParts bool
}

// CompositePools is the number of limiters (clients, pools) the
// composite concurrency check spreads its goroutines over when the harness
// provides [CompositeHarness.NewClients]; each runs [Workers] goroutines.
const CompositePools = 4

// A CompositeCheck is one property of a composite limiter, as [Check] is
// for a limiter of one policy.
type CompositeCheck struct {
	Name  string
	Check func(t testing.TB, h CompositeHarness) error
}

// RunComposite runs every composite check against h as subtests of t, one
// after the other. The checks require the limiter to be a
// [ratekit.Peeker]: they read each policy's count with Peek to show that a
// denial by one policy took nothing from the others. Refund and Reset are
// checked where the limiter offers them.
//
// The checks, each over two policies of different quotas on one key: each
// policy admits exactly its quota (parts of different costs make each one
// bind in turn); a denial by any policy takes from none; the top-level
// Decision is [ratekit.Decision.Parts] summed up (RetryAfter the longest
// among the denying parts, Remaining that of the most restrictive);
// len(Request.Parts) must equal the number of policies and each part is
// validated against its own policy; Peek takes nothing; Refund gives back
// to every policy, never above its quota; Reset restores every policy of a
// key; and [CompositePools] × [Workers] goroutines count admissions exactly,
// with every policy's count consistent at the end.
//
// Use it from a test of your own composite:
//
//	func TestComposite(t *testing.T) {
//		limitertest.RunComposite(t, limitertest.CompositeHarness{
//			New: func(t testing.TB, policies []limitertest.Config) ratekit.Limiter {
//				return newMyComposite(t, policies)
//			},
//			Family: limitertest.TokenBucket,
//		})
//	}
func RunComposite(t *testing.T, h CompositeHarness) {
	t.Helper()
	if h.New == nil || h.Algorithm < ratekit.FixedWindow || h.Algorithm > ratekit.SlidingLog {
		t.Fatal("limitertest: CompositeHarness.New and CompositeHarness.Algorithm are required")
	}
	for _, c := range CompositeChecks() {
		t.Run(c.Name, func(t *testing.T) {
			if err := c.Check(t, h); err != nil {
				t.Error(err)
			}
		})
	}
}

// CompositeChecks returns the composite checks, in the order RunComposite
// runs them. On a real clock, a check of fixed or sliding windows waits
// out the hour as [Checks] says.
func CompositeChecks() []CompositeCheck {
	checks := []CompositeCheck{
		{"EachQuota", checkEachQuota},
		{"DenialTakesFromNone", checkDenialTakesFromNone},
		{"PartsValidation", checkPartsValidation},
		{"Peek", checkCompositePeek},
		{"Refund", checkCompositeRefund},
		{"Reset", checkCompositeReset},
		{"PartKeys", checkPartKeys},
		{"Concurrency", checkCompositeConcurrency},
	}
	for i := range checks {
		checks[i].Check = afterRollover(checks[i].Check, func(h CompositeHarness) (func(time.Duration), ratekit.Algorithm) { return h.Advance, h.Algorithm })
	}
	return checks
}

// twoPolicies returns a small and a large policy of different windows,
// named after prefix.
func twoPolicies(prefix string, small, large int64) []Config {
	return []Config{
		{Name: prefix + "-small", Quota: small, Window: longWindow},
		{Name: prefix + "-large", Quota: large, Window: 2 * longWindow},
	}
}

// cclient threads client-carried state through the requests of one
// subject to a composite.
type cclient struct {
	l     ratekit.Limiter
	key   string
	state string
	carry bool
}

func newCClient(h CompositeHarness, l ratekit.Limiter, key string) *cclient {
	return &cclient{l: l, key: key, carry: h.ClientState}
}

// req is a request of cost 1 with one part of costs[i] per policy, or
// without parts when costs is empty.
func (c *cclient) req(costs ...int64) ratekit.Request {
	r := ratekit.Request{Key: c.key, Cost: 1, State: c.state}
	for _, n := range costs {
		r.Parts = append(r.Parts, ratekit.Part{Key: c.key, Cost: n})
	}
	return r
}

func (c *cclient) keep(d ratekit.Decision) {
	if c.carry && d.State != "" {
		c.state = d.State
	}
}

func (c *cclient) allow(costs ...int64) (ratekit.Decision, error) {
	ctx, cancel := ctxFor()
	defer cancel()
	d, err := c.l.Allow(ctx, c.req(costs...))
	if err != nil {
		return d, fmt.Errorf("Allow(key %.40q, part costs %v): %w", c.key, costs, err)
	}
	c.keep(d)
	return d, nil
}

// remaining peeks at every policy of c's key and returns each one's
// Remaining.
func (c *cclient) remaining() ([]int64, error) {
	p, ok := c.l.(ratekit.Peeker)
	if !ok {
		return nil, errors.New("the composite is not a ratekit.Peeker; the composite checks read every policy's count with Peek")
	}
	ctx, cancel := ctxFor()
	defer cancel()
	d, err := p.Peek(ctx, c.req())
	if err != nil {
		return nil, fmt.Errorf("Peek(key %.40q): %w", c.key, err)
	}
	out := make([]int64, len(d.Parts))
	for i := range d.Parts {
		out[i] = d.Parts[i].Remaining
	}
	return out, nil
}

func wantRemaining(what string, c *cclient, want ...int64) error {
	got, err := c.remaining()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("%s: Peek reports remaining %v per policy, want %v", what, got, want)
	}
	return nil
}

// saneComposite checks d's parts against policies (each as [sane] checks a
// single decision), wants each part's Allowed and Remaining as given, and
// checks that the top-level Decision sums the parts up as
// ratekit.Decision.Parts documents.
func saneComposite(what string, d ratekit.Decision, policies []Config, fam ratekit.Algorithm, allowed []bool, remaining []int64) error {
	if len(d.Parts) != len(policies) {
		return fmt.Errorf("%s: %d parts, want one per policy (%d): %+v", what, len(d.Parts), len(policies), d)
	}
	all := true
	for i, p := range d.Parts {
		if p.Allowed != allowed[i] || p.Remaining != remaining[i] {
			return fmt.Errorf("%s: part %d (%s): Allowed %v, Remaining %d; want Allowed %v, Remaining %d (decision %+v)",
				what, i, policies[i].Name, p.Allowed, p.Remaining, allowed[i], remaining[i], d)
		}
		if err := sane(fmt.Sprintf("%s, part %d", what, i), p, policies[i], fam); err != nil {
			return err
		}
		if p.Parts != nil {
			return fmt.Errorf("%s: part %d has parts of its own", what, i)
		}
		all = all && p.Allowed
	}
	if d.Allowed != all {
		return fmt.Errorf("%s: Allowed %v, but the parts' Allowed are %v", what, d.Allowed, allowed)
	}
	pick, retry := mostRestrictive(d.Parts, all)
	m := d.Parts[pick]
	if d.RetryAfter != retry {
		return fmt.Errorf("%s: RetryAfter %v, want %v, the longest among the denying parts (decision %+v)", what, d.RetryAfter, retry, d)
	}
	if d.Quota != m.Quota || d.Remaining != m.Remaining || d.ResetAfter != m.ResetAfter || d.Policy != m.Policy {
		return fmt.Errorf("%s: top-level Quota %d, Remaining %d, ResetAfter %v, Policy %+v; want those of part %d, the most restrictive (decision %+v)",
			what, d.Quota, d.Remaining, d.ResetAfter, d.Policy, pick, d)
	}
	return nil
}

// mostRestrictive returns the most restrictive of parts (the smallest
// Remaining among the denying parts when any denied, all false; ties: the
// longest ResetAfter, then the earlier part) and the longest RetryAfter of
// the denying parts.
func mostRestrictive(parts []ratekit.Decision, all bool) (pick int, retry time.Duration) {
	pick = -1
	for i, p := range parts {
		if !all && p.Allowed {
			continue
		}
		if !p.Allowed && p.RetryAfter > retry {
			retry = p.RetryAfter
		}
		if pick < 0 || p.Remaining < parts[pick].Remaining ||
			p.Remaining == parts[pick].Remaining && p.ResetAfter > parts[pick].ResetAfter {
			pick = i
		}
	}
	return pick, retry
}

// checkEachQuota: parts of different costs make each policy bind in turn;
// each admits exactly its quota.
func checkEachQuota(t testing.TB, h CompositeHarness) error {
	pol := twoPolicies("each", 3, 6)
	c := newCClient(h, h.New(t, pol), "each-key")
	steps := []struct {
		costs     []int64
		allowed   []bool
		remaining []int64
	}{
		{nil, []bool{true, true}, []int64{2, 5}},
		{[]int64{1, 3}, []bool{true, true}, []int64{1, 2}},
		{[]int64{1, 2}, []bool{true, true}, []int64{0, 0}},
		{nil, []bool{false, false}, []int64{0, 0}},
		{[]int64{1, 1}, []bool{false, false}, []int64{0, 0}},
	}
	for i, s := range steps {
		d, err := c.allow(s.costs...)
		if err != nil {
			return err
		}
		if err := saneComposite(fmt.Sprintf("step %d (part costs %v)", i+1, s.costs), d, pol, h.Algorithm, s.allowed, s.remaining); err != nil {
			return err
		}
	}
	return wantRemaining("after both policies were exhausted", c, 0, 0)
}

// checkDenialTakesFromNone: a denial by either policy, or by both, takes
// nothing from any policy.
func checkDenialTakesFromNone(t testing.TB, h CompositeHarness) error {
	pol := twoPolicies("denial", 3, 6)
	c := newCClient(h, h.New(t, pol), "denial-key")
	steps := []struct {
		costs     []int64
		allowed   []bool
		remaining []int64
	}{
		{[]int64{2, 4}, []bool{true, true}, []int64{1, 2}},
		// The large policy denies, the small one would admit.
		{[]int64{1, 3}, []bool{true, false}, []int64{1, 2}},
		// The small policy denies, the large one would admit.
		{[]int64{2, 1}, []bool{false, true}, []int64{1, 2}},
		// Both deny.
		{[]int64{3, 5}, []bool{false, false}, []int64{1, 2}},
		// What is left is still there.
		{[]int64{1, 2}, []bool{true, true}, []int64{0, 0}},
	}
	for i, s := range steps {
		d, err := c.allow(s.costs...)
		if err != nil {
			return err
		}
		what := fmt.Sprintf("step %d (part costs %v)", i+1, s.costs)
		if err := saneComposite(what, d, pol, h.Algorithm, s.allowed, s.remaining); err != nil {
			return err
		}
		if err := wantRemaining("after "+what, c, s.remaining...); err != nil {
			return err
		}
	}
	return nil
}

// checkPartsValidation: the number of parts must match the policies, each
// part is checked against its own policy, and invalid requests take
// nothing.
func checkPartsValidation(t testing.TB, h CompositeHarness) error {
	pol := twoPolicies("parts", 3, 6)
	l := h.New(t, pol)
	c := newCClient(h, l, "parts-key")
	ctx, cancel := ctxFor()
	defer cancel()
	part := func(n int64) ratekit.Part { return ratekit.Part{Key: c.key, Cost: n} }
	for _, tc := range []struct {
		name  string
		parts []ratekit.Part
		want  error
	}{
		{"one part for two policies", []ratekit.Part{part(1)}, ratekit.ErrInvalidRequest},
		{"three parts for two policies", []ratekit.Part{part(1), part(1), part(1)}, ratekit.ErrInvalidRequest},
		{"empty parts for two policies", []ratekit.Part{}, ratekit.ErrInvalidRequest},
		{"a part of cost 0", []ratekit.Part{part(1), part(0)}, ratekit.ErrInvalidCost},
		{"a part of an empty key", []ratekit.Part{part(1), {Key: "", Cost: 1}}, ratekit.ErrEmptyKey},
		{"a part above its policy's quota", []ratekit.Part{part(4), part(1)}, ratekit.ErrCostExceedsQuota},
		{"a part above the large policy's quota", []ratekit.Part{part(1), part(7)}, ratekit.ErrCostExceedsQuota},
	} {
		_, err := l.Allow(ctx, ratekit.Request{Key: c.key, Cost: 1, Parts: tc.parts})
		if !errors.Is(err, tc.want) || !errors.Is(err, ratekit.ErrInvalidRequest) {
			return fmt.Errorf("%s: error %v, want one matching %v and ErrInvalidRequest", tc.name, err, tc.want)
		}
	}
	// Without parts, Cost counts against every policy: above the small
	// quota it can never be admitted.
	if _, err := l.Allow(ctx, ratekit.Request{Key: c.key, Cost: 4}); !errors.Is(err, ratekit.ErrCostExceedsQuota) {
		return fmt.Errorf("cost 4 without parts on quotas 3 and 6: %v, want ErrCostExceedsQuota", err)
	}
	if err := wantRemaining("after invalid requests", c, 3, 6); err != nil {
		return err
	}
	d, err := c.allow(3, 6)
	if err != nil {
		return err
	}
	return saneComposite("parts of exactly each quota", d, pol, h.Algorithm, []bool{true, true}, []int64{0, 0})
}

func checkCompositePeek(t testing.TB, h CompositeHarness) error {
	pol := twoPolicies("peek", 3, 6)
	l := h.New(t, pol)
	p, ok := l.(ratekit.Peeker)
	if !ok {
		return errors.New("the composite is not a ratekit.Peeker")
	}
	c := newCClient(h, l, "peek-key")
	if _, err := c.allow(1, 2); err != nil {
		return err
	}
	ctx, cancel := ctxFor()
	defer cancel()
	for i := 0; i < 3; i++ {
		d, err := p.Peek(ctx, c.req(2, 4))
		if err != nil {
			return fmt.Errorf("peek: %w", err)
		}
		if err := saneComposite("Peek of part costs [2 4] with [2 4] remaining", d, pol, h.Algorithm, []bool{true, true}, []int64{2, 4}); err != nil {
			return err
		}
		d, err = p.Peek(ctx, c.req(1, 5))
		if err != nil {
			return fmt.Errorf("peek: %w", err)
		}
		if err := saneComposite("Peek of part costs [1 5] with [2 4] remaining", d, pol, h.Algorithm, []bool{true, false}, []int64{2, 4}); err != nil {
			return err
		}
	}
	if _, err := p.Peek(ctx, ratekit.Request{Key: c.key, Cost: 1, Parts: []ratekit.Part{{Key: c.key, Cost: 1}}}); !errors.Is(err, ratekit.ErrInvalidRequest) {
		return fmt.Errorf("peek with one part for two policies: %v, want ErrInvalidRequest", err)
	}
	d, err := c.allow(2, 4)
	if err != nil {
		return err
	}
	return saneComposite("after the peeks", d, pol, h.Algorithm, []bool{true, true}, []int64{0, 0})
}

func checkCompositeRefund(t testing.TB, h CompositeHarness) error {
	pol := twoPolicies("refund", 3, 6)
	l := h.New(t, pol)
	r, ok := l.(ratekit.Refunder)
	if !ok {
		t.Log("the composite is not a ratekit.Refunder")
		return nil
	}
	c := newCClient(h, l, "refund-key")
	if _, err := c.allow(2, 5); err != nil {
		return err
	}
	ctx, cancel := ctxFor()
	defer cancel()
	d, err := r.Refund(ctx, c.req(1, 3))
	if err != nil {
		return fmt.Errorf("refund: %w", err)
	}
	c.keep(d)
	if err := saneComposite("Refund of part costs [1 3] with [1 1] remaining", d, pol, h.Algorithm, []bool{true, true}, []int64{2, 4}); err != nil {
		return err
	}
	if err := wantRemaining("after the refund", c, 2, 4); err != nil {
		return err
	}
	// Never above each policy's quota.
	d, err = r.Refund(ctx, c.req(3, 6))
	if err != nil {
		return fmt.Errorf("refund: %w", err)
	}
	c.keep(d)
	if err := saneComposite("oversized Refund", d, pol, h.Algorithm, []bool{true, true}, []int64{3, 6}); err != nil {
		return err
	}
	d, err = c.allow(3, 6)
	if err != nil {
		return err
	}
	if err := saneComposite("each full quota after an oversized refund", d, pol, h.Algorithm, []bool{true, true}, []int64{0, 0}); err != nil {
		return err
	}
	if _, err := r.Refund(ctx, ratekit.Request{Key: c.key, Cost: 1, State: c.state, Parts: []ratekit.Part{{Key: c.key, Cost: 1}}}); !errors.Is(err, ratekit.ErrInvalidRequest) {
		return fmt.Errorf("refund with one part for two policies: %v, want ErrInvalidRequest", err)
	}
	return wantRemaining("after a refused refund", c, 0, 0)
}

func checkCompositeReset(t testing.TB, h CompositeHarness) error {
	pol := twoPolicies("reset", 3, 6)
	l := h.New(t, pol)
	r, ok := l.(ratekit.Resetter)
	if !ok {
		t.Log("the composite is not a ratekit.Resetter")
		return nil
	}
	c := newCClient(h, l, "reset-key")
	other := newCClient(h, l, "reset-other-key")
	if _, err := c.allow(3, 6); err != nil {
		return err
	}
	if _, err := other.allow(1, 1); err != nil {
		return err
	}
	ctx, cancel := ctxFor()
	defer cancel()
	if err := r.Reset(ctx, c.key); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	c.state = ""
	if err := wantRemaining("after Reset", c, 3, 6); err != nil {
		return err
	}
	if err := wantRemaining("another key after Reset", other, 2, 5); err != nil {
		return err
	}
	if err := r.Reset(ctx, ""); !errors.Is(err, ratekit.ErrEmptyKey) {
		return fmt.Errorf("reset of an empty key: %v, want ErrEmptyKey", err)
	}
	return nil
}

// checkPartKeys: "3 per user and 6 per organisation": parts of different
// keys are counted apart, and a denial by the shared key takes nothing from
// the user's.
func checkPartKeys(t testing.TB, h CompositeHarness) error {
	if h.SameKeyParts {
		t.Log("the composite takes parts of the request's key only")
		return nil
	}
	pol := twoPolicies("keys", 3, 6)
	l := h.New(t, pol)
	ctx, cancel := ctxFor()
	defer cancel()
	req := func(user string) ratekit.Request {
		return ratekit.Request{Key: user, Cost: 1, Parts: []ratekit.Part{{Key: user, Cost: 1}, {Key: "org", Cost: 1}}}
	}
	for i, s := range []struct {
		user      string
		allowed   []bool
		remaining []int64
	}{
		{"u1", []bool{true, true}, []int64{2, 5}},
		{"u1", []bool{true, true}, []int64{1, 4}},
		{"u1", []bool{true, true}, []int64{0, 3}},
		{"u1", []bool{false, true}, []int64{0, 3}},
		{"u2", []bool{true, true}, []int64{2, 2}},
		{"u2", []bool{true, true}, []int64{1, 1}},
		{"u3", []bool{true, true}, []int64{2, 0}},
		{"u3", []bool{true, false}, []int64{2, 0}},
		{"u4", []bool{true, false}, []int64{3, 0}},
	} {
		d, err := l.Allow(ctx, req(s.user))
		if err != nil {
			return fmt.Errorf("step %d: %w", i+1, err)
		}
		if err := saneComposite(fmt.Sprintf("step %d (user %s, organisation org)", i+1, s.user), d, pol, h.Algorithm, s.allowed, s.remaining); err != nil {
			return err
		}
	}
	p, ok := l.(ratekit.Peeker)
	if !ok {
		return errors.New("the composite is not a ratekit.Peeker")
	}
	for user, want := range map[string]int64{"u1": 0, "u2": 1, "u3": 2, "u4": 3} {
		d, err := p.Peek(ctx, req(user))
		if err != nil {
			return fmt.Errorf("peek: %w", err)
		}
		if len(d.Parts) != 2 || d.Parts[0].Remaining != want || d.Parts[1].Remaining != 0 {
			return fmt.Errorf("peek of user %s: %+v, want %d remaining for the user and 0 for the organisation", user, d, want)
		}
	}
	return nil
}

// checkCompositeConcurrency: CompositePools × Workers goroutines on one
// fresh key. First with parts that make both policies bind at once (each
// admits exactly its quota), then with plain requests on another key that
// the small policy denies past its quota: the large one must have lost
// exactly what the small one admitted, nothing for the denials.
func checkCompositeConcurrency(t testing.TB, h CompositeHarness) error {
	const small, large = 100, 200
	pol := []Config{
		{Name: "concurrency-small", Quota: small, Window: 24 * time.Hour},
		{Name: "concurrency-large", Quota: large, Window: 24 * time.Hour},
	}
	var ls []ratekit.Limiter
	if h.NewClients != nil {
		ls = h.NewClients(t, pol, CompositePools)
		if len(ls) != CompositePools {
			return fmt.Errorf("NewClients returned %d limiters, want %d", len(ls), CompositePools)
		}
	} else {
		l := h.New(t, pol)
		for i := 0; i < CompositePools; i++ {
			ls = append(ls, l)
		}
	}
	for _, phase := range []struct {
		key       string
		costs     []int64
		admit     int64
		remaining []int64
	}{
		{"hot-parts-key", []int64{1, 2}, small, []int64{0, 0}},
		{"hot-plain-key", nil, small, []int64{0, large - small}},
	} {
		per := 2 // enough requests for several times the quota in all
		if h.ClientState {
			per = small + 2 // each client is held to the quota on its own
		}
		counts, last, err := compositeBurst(h, ls, phase.key, per, phase.costs)
		if err != nil {
			return err
		}
		if h.ClientState {
			for i, n := range counts {
				if n != phase.admit {
					return fmt.Errorf("%s: client %d was admitted %d times in %d requests, want exactly %d", phase.key, i, n, per, phase.admit)
				}
				if err := wantRemaining(fmt.Sprintf("%s: client %d at the end", phase.key, i), last[i], phase.remaining...); err != nil {
					return err
				}
			}
			continue
		}
		var total int64
		for _, n := range counts {
			total += n
		}
		if total != phase.admit {
			return fmt.Errorf("%s: %d goroutines admitted %d (part costs %v) on quotas %d and %d; want exactly %d",
				phase.key, len(counts), total, phase.costs, small, large, phase.admit)
		}
		if err := wantRemaining(phase.key+" at the end", last[0], phase.remaining...); err != nil {
			return err
		}
	}
	return nil
}

// compositeBurst has Workers goroutines per limiter of ls make per
// requests each on key (with parts of costs when given), each goroutine a
// client of its own, and returns each goroutine's admissions and client.
func compositeBurst(h CompositeHarness, ls []ratekit.Limiter, key string, per int, costs []int64) ([]int64, []*cclient, error) {
	ctx, cancel := ctxFor()
	defer cancel()
	n := len(ls) * Workers
	counts := make([]int64, n)
	clients := make([]*cclient, n)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		start = make(chan struct{})
	)
	for g := 0; g < n; g++ {
		c := newCClient(h, ls[g%len(ls)], key)
		clients[g] = c
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < per; i++ {
				d, err := c.l.Allow(ctx, c.req(costs...))
				if err != nil {
					once.Do(func() { first = err })
					return
				}
				c.keep(d)
				if d.Allowed {
					counts[g]++
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	return counts, clients, first
}
