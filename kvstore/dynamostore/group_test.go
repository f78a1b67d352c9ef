package dynamostore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
)

// action is what an opFault does with a request.
type action int

const (
	send   action = iota
	refuse        // fail without sending
	lose          // send, then drop the reply
)

// opFault is an http.RoundTripper that decides per DynamoDB operation
// whether to send a request, refuse it or lose its reply.
type opFault struct {
	next http.RoundTripper
	mu   sync.Mutex
	rule func(op string) action
	sent map[string]int
}

func (f *opFault) set(rule func(op string) action) {
	f.mu.Lock()
	f.rule = rule
	f.mu.Unlock()
}

func (f *opFault) count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent[op]
}

func (f *opFault) RoundTrip(r *http.Request) (*http.Response, error) {
	op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
	f.mu.Lock()
	a := send
	if f.rule != nil {
		a = f.rule(op)
	}
	if a != refuse {
		f.sent[op]++
	}
	f.mu.Unlock()
	if a == refuse {
		return nil, errInjected
	}
	resp, err := f.next.RoundTrip(r)
	if err == nil && a == lose {
		resp.Body.Close()
		return nil, errors.New("injected: connection reset after the request was sent")
	}
	return resp, err
}

// groupEnv is a test's table space: a prefix, a raw client and Stores on
// clocks of their own.
type groupEnv struct {
	t      *testing.T
	prefix string
	raw    *dynamodb.Client
	fault  *opFault
	client *dynamodb.Client
}

func newGroupEnv(t *testing.T) *groupEnv {
	e := &groupEnv{t: t, prefix: prefix(t), raw: newClient(t, nil)}
	e.client = newClient(t, func(rt http.RoundTripper) http.RoundTripper {
		e.fault = &opFault{next: rt, sent: map[string]int{}}
		return e.fault
	})
	return e
}

func (e *groupEnv) store(clock *fakeclock.Clock) *dynamostore.Store {
	cfg := dynamostore.Config{Prefix: e.prefix, MaxAttempts: 8}
	if clock != nil {
		cfg.Now = clock.Now
	}
	return newStore(e.t, e.client, cfg)
}

// month returns bounds of 30-day periods, the current one starting at start.
func month(start time.Time, quota int64) *kvstore.PeriodBounds {
	const d = 30 * 24 * time.Hour
	p := &kvstore.PeriodBounds{Quota: quota}
	for i := range p.Bounds {
		p.Bounds[i] = start.Add(time.Duration(i-1) * d).UnixMicro()
	}
	return p
}

// perSecond is a bucket of 5 units (of 1e9) that refills one a second.
var perSecond = kvstore.Refill{Burst: 5 * unit, Rate: 1000}

func planUpdates(p *kvstore.PeriodBounds) []kvstore.Update {
	return []kvstore.Update{
		{Key: "burst", Refill: kvstore.Refill{Burst: 100, Rate: 1}, N: 1},
		{Key: "month", Period: p, N: 1},
	}
}

func mustMulti(t *testing.T, s *dynamostore.Store, group string, op kvstore.Op, u []kvstore.Update) []kvstore.OpResult {
	t.Helper()
	res := make([]kvstore.OpResult, len(u))
	if err := s.UpdateMulti(context.Background(), group, op, u, res); err != nil {
		t.Fatalf("UpdateMulti(%q, op %d): %v", group, op, err)
	}
	return res
}

// usage returns what PeriodUsage reports, sorted, as "group/key start used".
func usage(t *testing.T, s *dynamostore.Store, keyPrefix string, from, to int64) []string {
	t.Helper()
	var got []string
	err := s.PeriodUsage(context.Background(), keyPrefix, from, to, func(u kvstore.PeriodUsage) error {
		got = append(got, fmt.Sprintf("%s/%s %d-%d %d", u.Group, u.Key, u.Start, u.End, u.Used))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(got)
	return got
}

// TestGroupRollHistory: a take in a later period moves the counter and
// writes the ended period as a history item in the same call; PeriodUsage
// reports every period once, before and after; a crash between the steps
// (the history's PutItem refused) loses nothing: the pending period is
// reported from the group item, and the next move writes it.
func TestGroupRollHistory(t *testing.T) {
	e := newGroupEnv(t)
	clock := fakeclock.New(t0)
	s := e.store(clock)
	ctx := context.Background()
	p1 := month(t0, 10)
	for i := 0; i < 3; i++ {
		mustMulti(t, s, "cust", kvstore.OpTake, planUpdates(p1))
	}
	mustMulti(t, s, "other", kvstore.OpTake, planUpdates(p1))
	span := func(p *kvstore.PeriodBounds) string {
		return fmt.Sprintf("%d-%d", p.Bounds[1], p.Bounds[2])
	}
	want := []string{"cust/month " + span(p1) + " 3", "other/month " + span(p1) + " 1"}
	if got := usage(t, s, "", 0, kvstore.MaxPeriodBound); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("usage in the first period = %q, want %q", got, want)
	}
	// Next period: the roll's history write is refused (a crash after the
	// decision's write).
	clock.Add(30 * 24 * time.Hour)
	p2 := month(t0.Add(30*24*time.Hour), 10)
	e.fault.set(func(op string) action {
		if op == "PutItem" {
			return refuse
		}
		return send
	})
	res := mustMulti(t, s, "cust", kvstore.OpTake, planUpdates(p2))
	if !res[1].OK || res[1].Used != 1 || res[1].Period != 2 {
		t.Fatalf("first take of the second period = %+v; want used 1", res[1])
	}
	e.fault.set(nil)
	want = []string{"cust/month " + span(p1) + " 3", "cust/month " + span(p2) + " 1", "other/month " + span(p1) + " 1"}
	if got := usage(t, s, "", 0, kvstore.MaxPeriodBound); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("usage with a pending period = %q, want %q", got, want)
	}
	// Third period: the move flushes the old pending period first, then
	// keeps the second as pending and writes it.
	clock.Add(30 * 24 * time.Hour)
	p3 := month(t0.Add(60*24*time.Hour), 10)
	mustMulti(t, s, "cust", kvstore.OpTake, planUpdates(p3))
	mustMulti(t, s, "cust", kvstore.OpTake, planUpdates(p3))
	want = []string{"cust/month " + span(p1) + " 3", "cust/month " + span(p2) + " 1", "cust/month " + span(p3) + " 2", "other/month " + span(p1) + " 1"}
	if got := usage(t, s, "", 0, kvstore.MaxPeriodBound); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("usage after two moves = %q, want %q", got, want)
	}
	// Ranges and prefixes.
	if got := usage(t, s, "", p2.Bounds[1], p3.Bounds[1]); len(got) != 1 || !strings.HasPrefix(got[0], "cust/month "+span(p2)) {
		t.Fatalf("usage of the second period only = %q", got)
	}
	if got := usage(t, s, "burst", 0, kvstore.MaxPeriodBound); len(got) != 0 {
		t.Fatalf("usage of keys starting with burst = %q, want none", got)
	}
	// The history items are items of their own: a store's key space sees
	// none of them.
	stop := errors.New("stop")
	if err := s.PeriodUsage(ctx, "", 0, kvstore.MaxPeriodBound, func(kvstore.PeriodUsage) error { return stop }); err != stop {
		t.Fatalf("PeriodUsage with fn's error: %v, want it as is", err)
	}
}

// TestGroupClockAhead: a decision on an item last written by a clock more
// than MaxClockAhead ahead is refused with ErrClockSkew and changes
// nothing; within it, or from the instance ahead, decisions go on.
func TestGroupClockAhead(t *testing.T) {
	e := newGroupEnv(t)
	ahead := fakeclock.New(t0.Add(dynamostore.MaxClockAhead + time.Second))
	near := fakeclock.New(t0.Add(time.Second))
	behind := fakeclock.New(t0)
	p := month(t0.Add(-time.Hour), 10)
	sa, sn, sb := e.store(ahead), e.store(near), e.store(behind)
	// The counter alone: a bucket read before its last write's time
	// holds fewer units (see TestClockSkew), which is not under test.
	u := planUpdates(p)[1:]
	mustMulti(t, sa, "g", kvstore.OpTake, u)
	for _, op := range []kvstore.Op{kvstore.OpTake, kvstore.OpPeek, kvstore.OpRefund} {
		err := sb.UpdateMulti(context.Background(), "g", op, u, make([]kvstore.OpResult, 1))
		if !errors.Is(err, ratekit.ErrClockSkew) {
			t.Fatalf("op %d from a clock %v behind the item's write: %v, want ErrClockSkew", op, dynamostore.MaxClockAhead+time.Second, err)
		}
	}
	// Within MaxClockAhead of the write: decided, on the line.
	if res := mustMulti(t, sn, "g", kvstore.OpTake, u); !res[0].OK || res[0].Used != 2 {
		t.Fatalf("take from a clock within MaxClockAhead = %+v, want used 2", res)
	}
	// The instance ahead decides on an item written behind it.
	if res := mustMulti(t, sa, "g", kvstore.OpTake, u); !res[0].OK || res[0].Used != 3 {
		t.Fatalf("take from the clock ahead = %+v, want used 3", res)
	}
}

// TestGroupSkewAtBoundary: an instance ahead starts the next period; one
// behind then counts into that later period (its record keeps its count),
// never a fresh one.
func TestGroupSkewAtBoundary(t *testing.T) {
	e := newGroupEnv(t)
	boundary := t0
	ahead := fakeclock.New(boundary.Add(time.Second))
	behind := fakeclock.New(boundary.Add(-time.Second))
	sa, sb := e.store(ahead), e.store(behind)
	// Each instance computes its bounds from its own calendar: the one
	// behind is still in the period that ends at the boundary.
	pb := month(boundary.Add(-30*24*time.Hour), 5)
	pa := month(boundary, 5)
	for i := 0; i < 4; i++ {
		mustMulti(t, sb, "g", kvstore.OpTake, planUpdates(pb))
	}
	u := func(p *kvstore.PeriodBounds) []kvstore.Update { return planUpdates(p)[1:] }
	mustMulti(t, sa, "g", kvstore.OpTake, u(pa))
	res := mustMulti(t, sb, "g", kvstore.OpTake, u(pb))
	if !res[0].OK || res[0].Used != 2 || res[0].Period != 2 {
		t.Fatalf("take behind after the move = %+v; want counted into the later period (used 2)", res[0])
	}
	got := usage(t, sa, "", 0, kvstore.MaxPeriodBound)
	if len(got) != 2 || !strings.HasSuffix(got[0], " 4") || !strings.HasSuffix(got[1], " 2") {
		t.Fatalf("usage = %q, want the ended period at 4 and the later at 2", got)
	}
}

// TestGroupForeignItems: items another program wrote under a group's
// partition key, or a plain key's, are reported and never rewritten.
func TestGroupForeignItems(t *testing.T) {
	e := newGroupEnv(t)
	s := e.store(nil)
	ctx := context.Background()
	pk := func(k string) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberB{Value: []byte(e.prefix + k)}}
	}
	put := func(k string, attrs map[string]types.AttributeValue) {
		item := pk(k)
		for n, v := range attrs {
			item[n] = v
		}
		if _, err := e.raw.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(tableName()), Item: item}); err != nil {
			t.Fatal(err)
		}
	}
	n := func(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }
	good := map[string]types.AttributeValue{"g": n("1"), "w": n("1"), "t": n("1"), "ttl": n("99999999999")}
	with := func(extra map[string]types.AttributeValue) map[string]types.AttributeValue {
		m := map[string]types.AttributeValue{}
		for k, v := range good {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	foreign := map[string]map[string]types.AttributeValue{
		"plain":         {"v": n("1"), "t": n("2"), "e": n("99999999999999")},
		"other program": {"data": &types.AttributeValueMemberS{Value: "x"}},
		"wrong mark":    with(map[string]types.AttributeValue{"g": n("2")}),
		"extra":         with(map[string]types.AttributeValue{"zz": n("1")}),
		"record string": with(map[string]types.AttributeValue{"kmonth": &types.AttributeValueMemberS{Value: "x"}}),
		"huge x":        with(map[string]types.AttributeValue{"kburst": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"x": n(strings.Repeat("9", 38)), "r": n("1"), "t": n("1"), "e": n("1")}}}),
		"bad period":    with(map[string]types.AttributeValue{"kmonth": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"s": n("5"), "n": n("5"), "c": n("1")}}}),
		"counter kind":  with(map[string]types.AttributeValue{"kburst": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"s": n("5"), "n": n("6"), "c": n("1")}}}),
	}
	p := month(time.Now(), 10)
	for name, attrs := range foreign {
		g := "g-" + strings.ReplaceAll(name, " ", "-")
		put("\xffg"+g, attrs)
		before, _ := e.raw.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(tableName()), Key: pk("\xffg" + g), ConsistentRead: aws.Bool(true)})
		for _, op := range []kvstore.Op{kvstore.OpTake, kvstore.OpPeek, kvstore.OpRefund} {
			err := s.UpdateMulti(ctx, g, op, planUpdates(p), make([]kvstore.OpResult, 2))
			if !errors.Is(err, kvstore.ErrMalformedRecord) {
				t.Errorf("%s, op %d: %v, want ErrMalformedRecord", name, op, err)
			}
		}
		after, _ := e.raw.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(tableName()), Key: pk("\xffg" + g), ConsistentRead: aws.Bool(true)})
		if show(before.Item) != show(after.Item) {
			t.Errorf("%s: the item was rewritten: %v, then %v", name, before.Item, after.Item)
		}
	}
	// A group item read as a plain key is reported too.
	mustMulti(t, s, "mine", kvstore.OpTake, planUpdates(p))
	if _, _, err := s.Get(ctx, "\xffgmine"); !errors.Is(err, kvstore.ErrMalformedRecord) {
		t.Errorf("Get of a group item's key: %v, want ErrMalformedRecord", err)
	}
	if _, err := s.Update(ctx, "\xffgmine", perSecond, kvstore.OpTake, 1); !errors.Is(err, kvstore.ErrMalformedRecord) {
		t.Errorf("Update of a group item's key: %v, want ErrMalformedRecord", err)
	}
	// The empty group's rules, and bad keys.
	for name, tc := range map[string]struct {
		group string
		u     []kvstore.Update
		want  error
	}{
		"two plain keys":     {"", []kvstore.Update{{Key: "a", Refill: perSecond, N: 1}, {Key: "b", Refill: perSecond, N: 1}}, kvstore.ErrCrossPartition},
		"plain counter":      {"", []kvstore.Update{{Key: "a", Period: p, N: 1}}, kvstore.ErrInvalidPeriod},
		"empty key":          {"g", []kvstore.Update{{Key: "", Refill: perSecond, N: 1}}, ratekit.ErrEmptyKey},
		"long key":           {"g", []kvstore.Update{{Key: strings.Repeat("k", dynamostore.MaxKeyLen+1), Refill: perSecond, N: 1}}, ratekit.ErrKeyTooLong},
		"long group":         {strings.Repeat("g", dynamostore.MaxKeyLen), []kvstore.Update{{Key: "a", Refill: perSecond, N: 1}}, ratekit.ErrKeyTooLong},
		"duplicate in plain": {"", []kvstore.Update{{Key: "a", Refill: perSecond, N: 1}, {Key: "a", Refill: perSecond, N: 1}}, kvstore.ErrDuplicateKey},
	} {
		if err := s.UpdateMulti(ctx, tc.group, kvstore.OpTake, tc.u, make([]kvstore.OpResult, len(tc.u))); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	// One plain key in the empty group is Update.
	if res := mustMulti(t, s, "", kvstore.OpTake, []kvstore.Update{{Key: "plain1", Refill: perSecond, N: unit}}); !res[0].OK {
		t.Fatalf("one plain key: %+v", res)
	}
	if r, err := s.Update(ctx, "plain1", perSecond, kvstore.OpPeek, 1); err != nil || r.Remaining > 4*unit+unit/10 {
		t.Fatalf("the plain key after UpdateMulti: %+v, %v", r, err)
	}
	// Keys that are not UTF-8 are records apart.
	bin := []kvstore.Update{{Key: "\xfe\x00", Period: p, N: 1}, {Key: "fe00", Period: p, N: 1}}
	mustMulti(t, s, "bin", kvstore.OpTake, bin)
	if res := mustMulti(t, s, "bin", kvstore.OpTake, bin[:1]); res[0].Used != 2 {
		t.Fatalf("binary key counted %d, want 2", res[0].Used)
	}
}

// show renders an item's attributes, for comparisons.
func show(m map[string]types.AttributeValue) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=", k)
		switch v := m[k].(type) {
		case *types.AttributeValueMemberM:
			b.WriteString("{" + show(v.Value) + "}")
		case *types.AttributeValueMemberN:
			b.WriteString(v.Value)
		case *types.AttributeValueMemberS:
			b.WriteString(v.Value)
		case *types.AttributeValueMemberB:
			fmt.Fprintf(&b, "%x", v.Value)
		default:
			fmt.Fprintf(&b, "%T", v)
		}
		b.WriteString(";")
	}
	return b.String()
}

// TestGroupStoresExact: several Store values (instances) with clients of
// their own take from one group; the admitted count is exact.
func TestGroupStoresExact(t *testing.T) {
	const stores, perStore, goroutines, quota = 4, 30, 4, 200
	p := prefix(t)
	pb := month(time.Now().Add(-time.Hour), quota)
	var admitted, failed atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < stores; i++ {
		s := newStore(t, newClient(t, nil), dynamostore.Config{Prefix: p, MaxAttempts: 16})
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < perStore; j++ {
					u := []kvstore.Update{{Key: "burst", Refill: kvstore.Refill{Burst: 1000, Rate: 1}, N: 1}, {Key: "month", Period: pb, N: 1}}
					res := make([]kvstore.OpResult, 2)
					if err := s.UpdateMulti(context.Background(), "shared", kvstore.OpTake, u, res); err != nil {
						failed.Add(1)
						t.Log(err)
					} else if res[0].OK && res[1].OK {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d calls failed", failed.Load())
	}
	s := newStore(t, nil, dynamostore.Config{Prefix: p})
	res := mustMulti(t, s, "shared", kvstore.OpPeek, []kvstore.Update{{Key: "month", Period: pb, N: 1}})
	if admitted.Load() != quota || res[0].Used != quota {
		t.Fatalf("admitted %d, counter at %d; want both %d", admitted.Load(), res[0].Used, quota)
	}
}

// TestGroupFaults: a refused connection and a silent one fail the call
// with the transport's error or the deadline, and a lost reply of a take
// leaves it applied once (the Store does not resend it).
func TestGroupFaults(t *testing.T) {
	e := newGroupEnv(t)
	s := e.store(nil)
	p := month(time.Now().Add(-time.Hour), 10)
	e.fault.set(func(string) action { return refuse })
	if err := s.UpdateMulti(context.Background(), "g", kvstore.OpTake, planUpdates(p), make([]kvstore.OpResult, 2)); !errors.Is(err, errInjected) {
		t.Fatalf("refused connection: %v, want the transport's error", err)
	}
	e.fault.set(nil)
	mustMulti(t, s, "g", kvstore.OpTake, planUpdates(p))
	sent := e.fault.count("UpdateItem")
	e.fault.set(func(op string) action {
		if op == "UpdateItem" {
			return lose
		}
		return send
	})
	if err := s.UpdateMulti(context.Background(), "g", kvstore.OpTake, planUpdates(p), make([]kvstore.OpResult, 2)); err == nil {
		t.Fatal("lost reply: nil error")
	}
	e.fault.set(nil)
	if n := e.fault.count("UpdateItem") - sent; n != 1 {
		t.Fatalf("%d UpdateItem sent for a take whose reply was lost, want 1", n)
	}
	if res := mustMulti(t, s, "g", kvstore.OpPeek, planUpdates(p)); res[1].Used != 2 {
		t.Fatalf("after the lost reply the counter is at %d, want 2", res[1].Used)
	}
	silent := silentStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := silent.UpdateMulti(ctx, "g", kvstore.OpTake, planUpdates(p), make([]kvstore.OpResult, 2)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("silent server: %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 600*time.Millisecond {
		t.Fatalf("silent server: took %v with a 200ms deadline", took)
	}
}
