package errprefix_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/breaker"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/lambda"
	"github.com/ratekit/ratekit/signedwindow"
	"github.com/ratekit/ratekit/tokenbucket"
)

// packages are the names an error may start with.
var packages = []string{"ratekit", "signedwindow", "tokenbucket", "durable", "pgstore", "memstore", "redisstore",
	"rueidisstore", "dynamostore", "httplimit", "lambda", "breaker", "otelratekit", "kvstore"}

// checkPrefix holds an error to the rule: it starts with the name of the
// package that was called and its class, "<package>: invalid config: ",
// and names no other package before the class.
func checkPrefix(t *testing.T, pkg, class string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", pkg)
		return
	}
	msg := err.Error()
	if want := pkg + ": " + class + ": "; !strings.HasPrefix(msg, want) {
		t.Errorf("%s: %q does not start with %q", pkg, msg, want)
	}
	for _, other := range packages {
		if other != pkg && regexp.MustCompile(`\b`+other+`: `).MatchString(msg) {
			t.Errorf("%s: %q names package %s too", pkg, msg, other)
		}
	}
	if strings.Count(msg, class) != 1 {
		t.Errorf("%s: %q says %q %d times", pkg, msg, class, strings.Count(msg, class))
	}
}

func TestConfigErrorPrefix(t *testing.T) {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := pgstore.New(&fakeDB{}, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	keys := []signedwindow.Key{{ID: 1, Secret: []byte(strings.Repeat("k", signedwindow.MinSecretLen))}}
	e := func(_ any, err error) error { return err }
	for _, tc := range []struct {
		pkg string
		err error
	}{
		{"signedwindow", e(signedwindow.New(signedwindow.Config{}))},
		{"signedwindow", e(signedwindow.New(signedwindow.Config{Name: "p", Quota: 0}))},
		{"signedwindow", e(signedwindow.NewComposite(signedwindow.CompositeConfig{}))},
		{"signedwindow", e(signedwindow.NewComposite(signedwindow.CompositeConfig{Keys: keys, Policies: []ratekit.Policy{{Name: "a b", Quota: 1, Window: time.Minute}}}))},
		{"tokenbucket", e(tokenbucket.New(tokenbucket.Config{}))},
		{"tokenbucket", e(tokenbucket.New(tokenbucket.Config{Name: "p", Store: store}))},
		{"tokenbucket", e(tokenbucket.NewComposite(tokenbucket.CompositeConfig{}))},
		{"tokenbucket", e(tokenbucket.NewComposite(tokenbucket.CompositeConfig{Mode: tokenbucket.Atomic, Store: store, Buckets: []tokenbucket.Bucket{{Name: "x"}}}))},
		{"durable", e(durable.New(durable.Config{Durability: durable.Unlogged}))},
		{"durable", e(durable.New(durable.Config{Store: pg, Policy: ratekit.Policy{Name: "p", Quota: 1, Algorithm: ratekit.FixedWindow}, Durability: durable.Unlogged}))},
		{"durable", e(durable.New(durable.Config{Store: pg, Policy: ratekit.Policy{Name: "p", Quota: 1, Window: time.Hour}, Durability: durable.Unlogged}))},
		{"durable", e(durable.NewComposite(nil))},
		{"durable", e(durable.NewComposite())},
		{"pgstore", e(pgstore.New(nil, pgstore.Config{}))},
		{"pgstore", e(pgstore.New(&fakeDB{}, pgstore.Config{Schema: "A B"}))},
		{"memstore", e(memstore.New(memstore.Config{MaxKeys: -1}))},
		{"redisstore", e(redisstore.New(nil, redisstore.Config{}))},
		{"rueidisstore", e(rueidisstore.New(nil, rueidisstore.Config{}))},
		{"dynamostore", e(dynamostore.New(nil, dynamostore.Config{}))},
		{"breaker", e(breaker.New(nil, breaker.Config{}))},
		{"lambda", e(lambda.New(lambda.Config{}))},
		{"lambda", e(lambda.ForwardedForKey(0))},
		{"httplimit", e(httplimit.NewGuard(httplimit.GuardConfig{}))},
		{"httplimit", e(httplimit.Middleware(httplimit.MiddlewareConfig{}))},
		{"httplimit", e(httplimit.ForwardedForKey(-1))},
	} {
		if !errors.Is(tc.err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want an ErrInvalidConfig", tc.pkg, tc.err)
			continue
		}
		checkPrefix(t, tc.pkg, "invalid config", tc.err)
	}
}

// TestRequestErrors: an invalid request is refused with the sentinel error
// of ratekit that says what is wrong, by every strategy alike.
func TestRequestErrors(t *testing.T) {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	keys := []signedwindow.Key{{ID: 1, Secret: []byte(strings.Repeat("k", signedwindow.MinSecretLen))}}
	sw, err := signedwindow.New(signedwindow.Config{Name: "p", Quota: 2, Window: time.Minute, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	tb, err := tokenbucket.New(tokenbucket.Config{Name: "p", Burst: 2, RefillRate: tokenbucket.PerSecond(1), Mode: tokenbucket.Atomic, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	all, err := ratekit.All(sw, tb)
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]ratekit.Limiter{"signedwindow": sw, "tokenbucket": tb, "All": all} {
		for _, tc := range []struct {
			req  ratekit.Request
			want error
		}{
			{ratekit.Request{Key: "", Cost: 1}, ratekit.ErrEmptyKey},
			{ratekit.Request{Key: strings.Repeat("k", ratekit.MaxKeyLen+1), Cost: 1}, ratekit.ErrKeyTooLong},
			{ratekit.Request{Key: "k", Cost: 0}, ratekit.ErrInvalidCost},
			{ratekit.Request{Key: "k", Cost: 3}, ratekit.ErrCostExceedsLimit},
		} {
			_, err := l.Allow(context.Background(), tc.req)
			if !errors.Is(err, tc.want) || !errors.Is(err, ratekit.ErrInvalidRequest) {
				t.Errorf("%s: Allow(%+v) = %v, want %v", name, tc.req, err, tc.want)
				continue
			}
			if msg := err.Error(); !strings.Contains(msg, "invalid request: ") || strings.Count(msg, "invalid request") != 1 {
				t.Errorf("%s: %q, want one \"invalid request: \"", name, msg)
			}
		}
	}
}

// fakeDB satisfies pgstore.DB for constructors, which never call it.
type fakeDB struct{}

func (fakeDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errors.New("not called")
}

func (fakeDB) QueryRow(context.Context, string, ...any) pgx.Row { return nil }
