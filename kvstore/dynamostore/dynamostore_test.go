package dynamostore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/kvstore/storetest"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func TestConformance(t *testing.T) {
	client := newClient(t, nil)
	storetest.Run(t, func(t *testing.T) kvstore.Store {
		return newStore(t, client, dynamostore.Config{})
	})
}

// TestEventuallyConsistentReads checks that Get reads with eventual
// consistency when asked to, and that Update never does.
func TestEventuallyConsistentReads(t *testing.T) {
	ctx := context.Background()
	var bodies []string
	var mu sync.Mutex
	client := newClient(t, func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			mu.Lock()
			bodies = append(bodies, r.Header.Get("X-Amz-Target")+" "+string(b))
			mu.Unlock()
			return rt.RoundTrip(r)
		})
	})
	for _, eventual := range []bool{false, true} {
		s := newStore(t, client, dynamostore.Config{EventuallyConsistentReads: eventual})
		if err := s.Set(ctx, "k", kvstore.Record{Value: 1, Time: 2}, time.Minute); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		bodies = nil
		mu.Unlock()
		if rec, ok, err := s.Get(ctx, "k"); err != nil || !ok || rec != (kvstore.Record{Value: 1, Time: 2}) {
			t.Fatalf("Get = %+v, %v, %v", rec, ok, err)
		}
		if _, err := s.Update(ctx, "k", kvstore.Refill{Burst: 10, Rate: 1}, kvstore.OpPeek, 1); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := bodies
		mu.Unlock()
		wantGet := fmt.Sprintf(`"ConsistentRead":%v`, !eventual)
		if len(got) != 2 || !strings.Contains(got[0], wantGet) || !strings.Contains(got[1], `"ConsistentRead":true`) {
			t.Errorf("EventuallyConsistentReads %v: requests %q; want Get with %s, then a consistent read", eventual, got, wantGet)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestNewInvalid(t *testing.T) {
	client := dynamodb.New(dynamodb.Options{Region: "us-east-1"})
	for _, tc := range []struct {
		name   string
		client *dynamodb.Client
		cfg    dynamostore.Config
	}{
		{"nil client", nil, dynamostore.Config{Table: "t"}},
		{"no table", client, dynamostore.Config{}},
		{"long prefix", client, dynamostore.Config{Table: "t", Prefix: strings.Repeat("p", 1025)}},
		{"negative attempts", client, dynamostore.Config{Table: "t", MaxAttempts: -1}},
		{"short history", client, dynamostore.Config{Table: "t", HistoryTTL: time.Hour}},
		{"negative history", client, dynamostore.Config{Table: "t", HistoryTTL: -1}},
		{"history past a century", client, dynamostore.Config{Table: "t", HistoryTTL: 101 * 365 * 24 * time.Hour}},
	} {
		if _, err := dynamostore.New(tc.client, tc.cfg); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want ratekit.ErrInvalidConfig", tc.name, err)
		}
	}
	if _, err := dynamostore.New(client, dynamostore.Config{Table: "t", Prefix: strings.Repeat("p", 1024)}); err != nil {
		t.Errorf("New with a 1024-byte prefix: %v", err)
	}
}

// TestKeys checks the keys DynamoDB would refuse, and that keys are opaque
// bytes: two strings that are not valid UTF-8 stay two items.
func TestKeys(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, nil, dynamostore.Config{})
	long := strings.Repeat("k", dynamostore.MaxKeyLen)
	if _, _, err := s.Get(ctx, long); !errors.Is(err, ratekit.ErrKeyTooLong) {
		t.Errorf("Get of a key over 2048 bytes with the prefix: %v, want ratekit.ErrKeyTooLong", err)
	}
	if _, err := s.Update(ctx, long, kvstore.Refill{Burst: 10, Rate: 1}, kvstore.OpTake, 1); !errors.Is(err, ratekit.ErrKeyTooLong) {
		t.Errorf("Update of a long key: %v, want ratekit.ErrKeyTooLong", err)
	}
	bare, err := dynamostore.New(newClient(t, nil), dynamostore.Config{Table: table(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := bare.Set(ctx, "", kvstore.Record{}, time.Minute); !errors.Is(err, ratekit.ErrEmptyKey) {
		t.Errorf("Set of an empty key without a prefix: %v, want ratekit.ErrEmptyKey", err)
	}
	keys := []string{"\xff", "\xfe", "\xff\xfe", "\xef\xbf\xbd"} // the last is U+FFFD
	for i, k := range keys {
		if err := s.Set(ctx, k, kvstore.Record{Value: int64(i), Time: 1}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for i, k := range keys {
		if rec, ok, err := s.Get(ctx, k); err != nil || !ok || rec.Value != int64(i) {
			t.Errorf("key %q: Get = %+v, %v, %v; want value %d", k, rec, ok, err, i)
		}
	}
}

// TestMalformedItem writes items that this package did not write under its
// keys: Get and Update refuse them.
func TestMalformedItem(t *testing.T) {
	ctx := context.Background()
	client := newClient(t, nil)
	p := prefix(t)
	s := newStore(t, client, dynamostore.Config{Prefix: p})
	n := func(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }
	for i, item := range []map[string]types.AttributeValue{
		{"other": &types.AttributeValueMemberS{Value: "x"}},
		{"v": &types.AttributeValueMemberS{Value: "1"}, "t": n("1"), "e": n("99999999999999999")},
		{"v": n("1"), "e": n("99999999999999999")},
		{"v": n("1.5"), "t": n("1"), "e": n("99999999999999999")},
		{"v": n("1"), "t": n("1")},
		{"v": n("1"), "t": n("1"), "e": n("99999999999999999"), "x": n("5")}, // x without r
	} {
		item[dynamostore.KeyAttribute] = &types.AttributeValueMemberB{Value: []byte(p + "bad")}
		if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table(t)), Item: item}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Get(ctx, "bad"); !errors.Is(err, kvstore.ErrMalformedRecord) {
			t.Errorf("item %d: Get = %v, want kvstore.ErrMalformedRecord", i, err)
		}
		if _, err := s.Update(ctx, "bad", kvstore.Refill{Burst: 10, Rate: 1}, kvstore.OpTake, 1); !errors.Is(err, kvstore.ErrMalformedRecord) {
			t.Errorf("item %d: Update = %v, want kvstore.ErrMalformedRecord", i, err)
		}
	}
}

// TestRequests counts the requests each kind of decision sends: one
// conditional UpdateItem for a take from an absent item or a bucket that is
// not full, one for a refused take (which writes nothing), two writes for a
// take from an item whose bucket has refilled completely but is not deleted
// yet, one GetItem for a peek.
func TestRequests(t *testing.T) {
	ctx := context.Background()
	var c *counter
	client := newClient(t, func(rt http.RoundTripper) http.RoundTripper { c = newCounter(rt).(*counter); return c })
	clock := fakeclock.New(t0)
	s := newStore(t, client, dynamostore.Config{Now: clock.Now})
	r := kvstore.Refill{Burst: 3_000_000, Rate: 1} // 3 units of 1e6, one a second
	const u = 1_000_000
	// failed says that the first conditional write fails: dynalite does
	// not return the item with a failed condition, so the Store reads it.
	check := func(what string, res kvstore.OpResult, err error, ok bool, value int64, failed bool, want map[string]int) {
		t.Helper()
		if err != nil || res.OK != ok || res.Remaining != value {
			t.Fatalf("%s: %+v, %v; want OK %v, value %d", what, res, err, ok, value)
		}
		got := c.take()
		if failed && !onAWS() {
			want["GetItem"]++
		}
		for op, n := range want {
			if got[op] != n {
				t.Errorf("%s: sent %v, want %v", what, got, want)
				return
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: sent %v, want %v", what, got, want)
		}
	}
	c.take()
	res, err := s.Update(ctx, "k", r, kvstore.OpTake, u)
	check("take from an absent item", res, err, true, 2*u, false, map[string]int{"UpdateItem": 1})
	clock.Add(100 * time.Millisecond)
	res, err = s.Update(ctx, "k", r, kvstore.OpTake, u)
	check("take from a bucket that is not full", res, err, true, u+100_000, false, map[string]int{"UpdateItem": 1})
	res, err = s.Update(ctx, "k", r, kvstore.OpTake, 2*u)
	check("refused take", res, err, false, u+100_000, true, map[string]int{"UpdateItem": 1})
	before, _, _ := s.Get(ctx, "k")
	c.take()
	res, err = s.Update(ctx, "k", r, kvstore.OpPeek, u)
	check("peek", res, err, true, u+100_000, false, map[string]int{"GetItem": 1})
	if after, _, _ := s.Get(ctx, "k"); after != before {
		t.Fatalf("a refused take or a peek changed the record: %+v became %+v", before, after)
	}
	c.take()
	// Full again after 1.9s; the item lives until full from empty (3s).
	clock.Add(2 * time.Second)
	res, err = s.Update(ctx, "k", r, kvstore.OpTake, u)
	// The Store remembers when the bucket is full: one UpdateItem (its
	// full form).
	check("take from a full bucket whose item lingers", res, err, true, 2*u, false, map[string]int{"UpdateItem": 1})
	// After its expiry the item reads as absent, deleted by DynamoDB or not.
	clock.Add(4 * time.Second)
	res, err = s.Update(ctx, "k", r, kvstore.OpTake, u)
	check("take from an expired item", res, err, true, 2*u, false, map[string]int{"UpdateItem": 1})
	// Another Store (an instance that knows nothing of the key): the
	// full form fails on a bucket that is not full, and the item decides.
	other, err := dynamostore.New(client, dynamostore.Config{Table: table(t), Prefix: s.Prefix(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	res, err = other.Update(ctx, "k", r, kvstore.OpTake, u)
	check("take by a Store without a hint", res, err, true, u, true, map[string]int{"UpdateItem": 2})
	res, err = other.Update(ctx, "k", r, kvstore.OpTake, u)
	check("its second take", res, err, true, 0, false, map[string]int{"UpdateItem": 1})
	res, err = s.Update(ctx, "k", r, kvstore.OpTake, u)
	check("a take on a hint that is out of date", res, err, false, 0, true, map[string]int{"UpdateItem": 1})
	// A record written by Set: an UpdateItem conditioned on it.
	if err := s.Set(ctx, "k", kvstore.Record{Value: 2 * u, Time: clock.Now().UnixMicro()}, time.Minute); err != nil {
		t.Fatal(err)
	}
	c.take()
	res, err = other.Update(ctx, "k", r, kvstore.OpTake, u)
	check("take from a record written by Set", res, err, true, u, true, map[string]int{"UpdateItem": 2})
	res, err = s.Update(ctx, "k", r, kvstore.OpRefund, u)
	check("refund", res, err, true, 2*u, false, map[string]int{"GetItem": 1, "UpdateItem": 1})
	res, err = s.Update(ctx, "k", r, kvstore.OpRefund, u)
	check("refund to full", res, err, true, 3*u, false, map[string]int{"GetItem": 1, "DeleteItem": 1})
	if _, ok, _ := s.Get(ctx, "k"); ok {
		t.Fatal("a refund to full left the item")
	}
}

// TestMatchesApply runs random operations (takes, peeks, refunds, records
// written by Set, the clock moving forward and back) through Update and
// through kvstore.Refill.Apply on a local record: every result must be the
// same, except that a record written by Update and read before its time is
// first moved back along its refill line (lineView; see the package doc).
func TestMatchesApply(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(t0)
	s := newStore(t, nil, dynamostore.Config{Now: clock.Now})
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	refills := []kvstore.Refill{
		{Burst: 10, Rate: 1},
		{Burst: 100 * 1000, Rate: 3},
		{Burst: kvstore.MaxValue, Rate: kvstore.MaxValue}, // x near 2^104
		{Burst: kvstore.MaxValue, Rate: 7},
	}
	for _, r := range refills {
		var rec kvstore.Record
		var ok, fromUpdate bool
		var exp int64 // the reference record's expiry
		key := "k" + time.Now().Format("150405.000000")
		var trace []string
		for i := 0; i < 150; i++ {
			switch rng.IntN(8) {
			case 0:
				clock.Add(-time.Duration(rng.IntN(3000)) * time.Microsecond)
			case 1, 2:
				clock.Add(time.Duration(rng.IntN(50)) * time.Microsecond)
			case 3:
				clock.Add(time.Duration(rng.Int64N(r.Burst/r.Rate+2)) * time.Microsecond)
			}
			now := clock.Now().UnixMicro()
			if rng.IntN(25) == 0 {
				want := kvstore.Record{Value: rng.Int64N(r.Burst+20) - 10, Time: now + rng.Int64N(2000) - 1000}
				if err := s.Set(ctx, key, want, time.Hour); err != nil {
					t.Fatal(err)
				}
				rec, ok, fromUpdate, exp = want, true, false, now+int64(time.Hour/time.Microsecond)
				trace = append(trace, fmt.Sprintf("set %+v", want))
				continue
			}
			op := []kvstore.Op{kvstore.OpTake, kvstore.OpTake, kvstore.OpTake, kvstore.OpPeek, kvstore.OpRefund}[rng.IntN(5)]
			n := 1 + rng.Int64N(min(r.Burst, 1+r.Burst/4))
			live := ok && exp > now
			view := rec
			if fromUpdate {
				view = lineView(rec, r, now)
			}
			want, next, write, err := r.Apply(view, live, now, op, n)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Update(ctx, key, r, op, n)
			trace = append(trace, fmt.Sprintf("at %d op %d n %d: %+v", now, op, n, got))
			if err != nil {
				t.Fatalf("seed %d, refill %+v, step %d: %v", seed, r, i, err)
			}
			if got != want {
				t.Fatalf("seed %d, refill %+v, step %d: op %d n %d at %d on %+v (live %v): Update = %+v, Apply = %+v\n%s", seed, r, i, op, n, now, rec, live, got, want, strings.Join(trace, "\n"))
			}
			switch {
			case !write:
			case next.Value >= r.Burst && !live:
				// Full, and absent or expired already: the Store writes
				// nothing, and an expired item stays (until DynamoDB
				// deletes it) for a clock that steps back before its
				// expiry.
			default:
				// The Store writes a record that lives until a bucket
				// emptied at its time would be full, or deletes it.
				rec, ok, fromUpdate = next, next.Value < r.Burst, true
				exp = next.Time + int64(r.TimeToFull(0)/time.Microsecond)
			}
		}
	}
}

// lineView returns rec, written by Update, as read at now: when now is
// before rec.Time, the point of its refill line at now,
// rec.Value − (rec.Time−now)×Rate, or −1 when that is below zero.
func lineView(rec kvstore.Record, r kvstore.Refill, now int64) kvstore.Record {
	if now >= rec.Time {
		return rec
	}
	v := new(big.Int).Mul(big.NewInt(rec.Time-now), big.NewInt(r.Rate))
	v.Sub(big.NewInt(rec.Value), v)
	if v.Sign() < 0 {
		return kvstore.Record{Value: -1, Time: now}
	}
	return kvstore.Record{Value: v.Int64(), Time: now}
}

// TestCreateTableTwice: CreateTable on an existing table is not an error.
func TestCreateTableTwice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := dynamostore.CreateTable(ctx, newClient(t, nil), table(t))
	if err != nil && !(errors.Is(err, dynamostore.ErrNoTTL) && !onAWS()) {
		t.Fatal(err)
	}
}
