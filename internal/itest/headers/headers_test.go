// Package headers_test parses every RateLimit-Policy, RateLimit and
// Retry-After field that ratekit's HTTP layer and Lambda adapters send with
// a real RFC 9651 parser (github.com/dunglas/httpsfv), for decisions of real
// limiters at the extremes of what their constructors accept, admitted,
// denied and failed.
package headers_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/dunglas/httpsfv"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/lambda"
	"github.com/ratekit/ratekit/signedwindow"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestMain(m *testing.M) { pgstoretest.Main(m, testenv.CheckLeaks) }

// limiters returns limiters at the extremes of their constructors.
func limiters(t *testing.T) map[string]ratekit.Limiter {
	t.Helper()
	out := map[string]ratekit.Limiter{}
	add := func(name string, l ratekit.Limiter, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = l
	}
	keys := []signedwindow.Key{{ID: 1, Secret: []byte(strings.Repeat("k", signedwindow.MinSecretLen))}}
	for _, q := range []int64{1, ratekit.MaxQuota} {
		for _, w := range []time.Duration{time.Second, signedwindow.MaxWindow} {
			l, err := signedwindow.New(signedwindow.Config{Name: "sw", Quota: q, Window: w, Keys: keys})
			add(fmt.Sprintf("signedwindow q=%d w=%v", q, w), l, err)
		}
	}
	swc, err := signedwindow.NewComposite(signedwindow.CompositeConfig{Keys: keys, Policies: []ratekit.Policy{
		{Name: "burst", Quota: ratekit.MaxQuota, Window: time.Second}, {Name: "daily", Quota: 1, Window: signedwindow.MaxWindow}}})
	add("signedwindow composite", swc, err)

	store, err := memstore.New(memstore.Config{MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		burst int64
		rate  tokenbucket.Rate
	}{
		{1, tokenbucket.Rate{Tokens: 1, Per: time.Microsecond}},                    // the shortest fill
		{1, tokenbucket.Rate{Tokens: 1, Per: kvstore.MaxValue * time.Microsecond}}, // the longest: 2^52 units
		{ratekit.MaxQuota, tokenbucket.Rate{Tokens: 9, Per: time.Microsecond}},
		{ratekit.MaxQuota, tokenbucket.Rate{Tokens: 1, Per: time.Microsecond}},
	} {
		l, err := tokenbucket.New(tokenbucket.Config{Name: "tb", Burst: c.burst, RefillRate: c.rate, Mode: tokenbucket.Atomic, Store: store})
		add(fmt.Sprintf("tokenbucket burst=%d rate=%+v", c.burst, c.rate), l, err)
	}

	s, err := pgstore.New(pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 4, ""), pgstore.Config{Schema: pgstoretest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	var parts []*durable.Limiter
	for _, alg := range []ratekit.Algorithm{ratekit.FixedWindow, ratekit.SlidingWindow, ratekit.TokenBucket, ratekit.SlidingLog} {
		for _, p := range []ratekit.Policy{
			{Quota: 1, Window: time.Millisecond},
			{Quota: ratekit.MaxQuota, Window: 100000 * time.Hour},
		} {
			if alg == ratekit.TokenBucket && p.Quota == ratekit.MaxQuota {
				p.Window = time.Duration(ratekit.MaxQuota) * time.Microsecond // one unit a microsecond, exactly
			}
			p.Name, p.Algorithm = "d-"+alg.String(), alg
			l, err := durable.New(durable.Config{Store: s, Policy: p, Prefix: pgstoretest.Prefix(t) + p.Name, Durability: durable.Unlogged})
			add(fmt.Sprintf("durable %v q=%d w=%v", alg, p.Quota, p.Window), l, err)
			parts = append(parts, l)
		}
	}
	c, err := durable.NewComposite(parts[1], parts[3], parts[5], parts[7])
	add("durable composite", c, err)
	return out
}

// decisions returns an admitted decision of l, a denied one (a second
// request after the first took the whole quota) and the key they used.
func decisions(t *testing.T, l ratekit.Limiter) []ratekit.Decision {
	t.Helper()
	ctx := context.Background()
	key := fmt.Sprintf("k-%d", time.Now().UnixNano())
	limit := int64(ratekit.MaxQuota)
	if p, ok := l.(interface{ Policy() ratekit.Policy }); ok {
		limit = p.Policy().Quota
	}
	var out []ratekit.Decision
	state := ""
	for _, cost := range []int64{1, limit, limit} {
		req := ratekit.Request{Key: key, Cost: cost, State: state}
		if c, ok := l.(interface{ Policies() []ratekit.Policy }); ok {
			req.Cost = 1
			for _, p := range c.Policies() {
				req.Cost = max(req.Cost, min(cost, p.Quota))
			}
			req.Cost = min(req.Cost, minQuota(c.Policies()))
		}
		d, err := l.Allow(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		state = d.State
		out = append(out, d)
	}
	return out
}

func minQuota(ps []ratekit.Policy) int64 {
	q := ps[0].Quota
	for _, p := range ps {
		q = min(q, p.Quota)
	}
	return q
}

// fixed answers with d, or fails with err.
type fixed struct {
	d   ratekit.Decision
	err error
}

func (f fixed) Allow(context.Context, ratekit.Request) (ratekit.Decision, error) { return f.d, f.err }

// answers returns the header fields each transport sends for l's answer.
func answers(t *testing.T, l ratekit.Limiter) map[string]http.Header {
	t.Helper()
	cfg := httplimit.GuardConfig{Limiter: l, OnError: httplimit.FailClosed, LegacyHeaders: true, RetrySpread: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)}
	out := map[string]http.Header{}
	mw, err := httplimit.Middleware(httplimit.MiddlewareConfig{GuardConfig: cfg, Key: httplimit.RemoteAddrKey()})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	out["net/http"] = rec.Header()

	g, err := httplimit.NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, err := lambda.New(lambda.Config{Guard: g, Key: lambda.SourceIPKey()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	httpAPI, err := a.HTTPAPI(func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		return events.APIGatewayV2HTTPResponse{StatusCode: 200}, nil
	})(ctx, events.APIGatewayV2HTTPRequest{RequestContext: events.APIGatewayV2HTTPRequestContext{HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{SourceIP: "192.0.2.1", Method: "GET"}}})
	if err != nil {
		t.Fatal(err)
	}
	out["lambda HTTP API"] = headerOf(httpAPI.Headers, nil)
	rest, err := a.REST(func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		return events.APIGatewayProxyResponse{StatusCode: 200}, nil
	})(ctx, events.APIGatewayProxyRequest{HTTPMethod: "GET", RequestContext: events.APIGatewayProxyRequestContext{Identity: events.APIGatewayRequestIdentity{SourceIP: "192.0.2.1"}}})
	if err != nil {
		t.Fatal(err)
	}
	out["lambda REST"] = headerOf(rest.Headers, rest.MultiValueHeaders)
	url, err := a.FunctionURL(func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
		return events.LambdaFunctionURLResponse{StatusCode: 200}, nil
	})(ctx, events.LambdaFunctionURLRequest{RequestContext: events.LambdaFunctionURLRequestContext{HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{SourceIP: "192.0.2.1", Method: "GET"}}})
	if err != nil {
		t.Fatal(err)
	}
	out["lambda function URL"] = headerOf(url.Headers, nil)
	xff, err := lambda.ForwardedForKey(1)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := lambda.New(lambda.Config{Guard: g, Key: xff})
	if err != nil {
		t.Fatal(err)
	}
	alb, err := a2.ALB(func(context.Context, events.ALBTargetGroupRequest) (events.ALBTargetGroupResponse, error) {
		return events.ALBTargetGroupResponse{StatusCode: 200}, nil
	})(ctx, events.ALBTargetGroupRequest{HTTPMethod: "GET", Headers: map[string]string{"x-forwarded-for": "192.0.2.1"}})
	if err != nil {
		t.Fatal(err)
	}
	out["lambda ALB"] = headerOf(alb.Headers, alb.MultiValueHeaders)
	return out
}

func headerOf(single map[string]string, multi map[string][]string) http.Header {
	h := http.Header{}
	for k, v := range single {
		h.Add(k, v)
	}
	for k, vs := range multi {
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	return h
}

// check parses h's rate-limit fields with an RFC 9651 parser.
func check(t *testing.T, where string, h http.Header, denied, failed bool) {
	t.Helper()
	n := 0
	for _, field := range []string{"RateLimit-Policy", "RateLimit"} {
		v := h.Values(field)
		if len(v) == 0 {
			if !failed {
				t.Errorf("%s: no %s field", where, field)
			}
			continue
		}
		l, err := httpsfv.UnmarshalList(v)
		if err != nil {
			t.Errorf("%s: %s %q does not parse as an RFC 9651 List: %v", where, field, v, err)
			continue
		}
		for _, m := range l {
			it, ok := m.(httpsfv.Item)
			if !ok {
				t.Errorf("%s: %s member %v is not an Item", where, field, m)
				continue
			}
			for _, p := range []string{"q", "w", "r", "t"} {
				if v, ok := it.Params.Get(p); ok {
					if i, ok := v.(int64); !ok || i < 0 {
						t.Errorf("%s: %s parameter %s = %v, want a non-negative Integer", where, field, p, v)
					}
					n++
				}
			}
		}
	}
	if ra := h.Get("Retry-After"); denied || failed {
		if s, err := strconv.ParseInt(ra, 10, 64); err != nil || s < 1 {
			t.Errorf("%s: Retry-After %q, want delay-seconds of at least 1", where, ra)
		}
	} else if ra != "" {
		t.Errorf("%s: Retry-After %q on an admitted request", where, ra)
	}
	if !failed && n == 0 {
		t.Errorf("%s: no parameter parsed", where)
	}
}

func TestEveryFieldParses(t *testing.T) {
	checked, denied := 0, 0
	for name, l := range limiters(t) {
		// A window of a millisecond may turn between the requests: such a
		// limiter need not deny the last one.
		ds := decisions(t, l)
		if !ds[0].Allowed {
			t.Fatalf("%s: the first request was denied: %+v", name, ds[0])
		}
		for i, d := range ds {
			if !d.Allowed {
				denied++
			}
			for where, h := range answers(t, fixed{d: d}) {
				check(t, fmt.Sprintf("%s, decision %d, %s", name, i, where), h, !d.Allowed, false)
				checked++
			}
		}
	}
	for where, h := range answers(t, fixed{err: errors.New("store down")}) {
		check(t, "failed, "+where, h, false, true)
		checked++
	}
	if denied < 10 {
		t.Fatalf("only %d denials among the decisions", denied)
	}
	t.Logf("%d answers parsed, %d of them to denials", checked, denied*5)
}

// TestQuotaAboveMaxRefused: no strategy accepts a quota (or burst) that an
// RFC 9651 Integer cannot carry.
func TestQuotaAboveMaxRefused(t *testing.T) {
	keys := []signedwindow.Key{{ID: 1, Secret: []byte(strings.Repeat("k", signedwindow.MinSecretLen))}}
	store, err := memstore.New(memstore.Config{MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	s, err := pgstore.New(pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 1, ""), pgstore.Config{Schema: pgstoretest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []int64{ratekit.MaxQuota + 1, 1 << 53, 1<<63 - 1} {
		_, err1 := signedwindow.New(signedwindow.Config{Name: "sw", Quota: q, Window: time.Minute, Keys: keys})
		_, err2 := tokenbucket.New(tokenbucket.Config{Name: "tb", Burst: q, RefillRate: tokenbucket.Rate{Tokens: 1, Per: time.Microsecond}, Mode: tokenbucket.Atomic, Store: store})
		_, err3 := durable.New(durable.Config{Store: s, Policy: ratekit.Policy{Name: "d", Quota: q, Window: time.Duration(1<<63 - 1), Algorithm: ratekit.FixedWindow}, Durability: durable.Unlogged})
		for i, err := range []error{err1, err2, err3} {
			if !errors.Is(err, ratekit.ErrInvalidConfig) {
				t.Errorf("quota %d, strategy %d: %v, want ErrInvalidConfig", q, i, err)
			}
		}
	}
}
