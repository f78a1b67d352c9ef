package otelratekit_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/otelratekit"
	"github.com/ratekit/ratekit/tokenbucket"
)

var epoch = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

// bucket returns a token bucket in memory on a clock that never moves, so
// that exactly burst requests are admitted.
func bucket(t testing.TB, name string, burst int64) *tokenbucket.Limiter {
	t.Helper()
	now := func() time.Time { return epoch }
	store, err := memstore.New(memstore.Config{MaxKeys: 1000, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	l, err := tokenbucket.New(tokenbucket.Config{
		Name: name, Burst: burst, RefillRate: tokenbucket.PerMinute(1),
		Mode: tokenbucket.Atomic, Store: store, Now: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// flaky is a limiter whose store can be made to fail, as a Redis that went
// away or answered too late would.
type flaky struct {
	*tokenbucket.Limiter
	mu   sync.Mutex
	fail error
}

func (f *flaky) set(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

func (f *flaky) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	f.mu.Lock()
	err := f.fail
	f.mu.Unlock()
	if err != nil {
		return ratekit.Decision{}, fmt.Errorf("tokenbucket: %w", err)
	}
	return f.Limiter.Allow(ctx, req)
}

type providers struct {
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newProviders() *providers {
	p := &providers{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	p.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.reader))
	p.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p.spans))
	return p
}

func (p *providers) observer(t testing.TB, strategy, store string) *ratekit.Observer {
	t.Helper()
	o, err := otelratekit.NewObserver(otelratekit.Config{MeterProvider: p.mp, TracerProvider: p.tp, Strategy: strategy, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// collect returns every data point of the ratekit metrics as
// "metric{attr=value,...}" mapped to its value (a sum, or a histogram's
// count).
func (p *providers) collect(t testing.TB) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := p.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelratekit.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, otelratekit.ScopeName)
		}
		for _, m := range sm.Metrics {
			want := map[string]string{
				"ratekit.decisions": "{decision}", "ratekit.decision.duration": "s",
				"ratekit.store.errors": "{error}", "ratekit.failure_policy.events": "{event}",
			}[m.Name]
			if m.Unit != want {
				t.Errorf("%s: unit %q, want %q", m.Name, m.Unit, want)
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if !d.IsMonotonic {
					t.Errorf("%s is not monotonic", m.Name)
				}
				for _, dp := range d.DataPoints {
					got[m.Name+"{"+dp.Attributes.Encoded(attribute.DefaultEncoder())+"}"] = dp.Value
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					got[m.Name+"{"+dp.Attributes.Encoded(attribute.DefaultEncoder())+"}"] = int64(dp.Count)
					if min, ok := dp.Min.Value(); !ok || min < 0 {
						t.Errorf("%s: min %v", m.Name, min)
					}
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return got
}

func diff(t *testing.T, got, want map[string]int64) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			t.Errorf("%s = %d, want %d", k, got[k], want[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected %s = %d", k, got[k])
		}
	}
}

// TestScriptedSequence drives a Guard through admits, denials, store
// failures, a too-slow store, fallbacks, a fail-open and an invalid request,
// and asserts every count and attribute that reaches the reader and every
// span.
func TestScriptedSequence(t *testing.T) {
	p := newProviders()
	redisObs := p.observer(t, "tokenbucket", "redis")
	localObs := p.observer(t, "tokenbucket", "memory")
	primary := &flaky{Limiter: bucket(t, "api", 3)}
	observed := ratekit.Observe(primary, redisObs)
	fallback := ratekit.Observe(bucket(t, "api-local", 2), localObs)
	quiet := httplimit.GuardConfig{Limiter: observed, Observer: redisObs, Logger: discard()}
	fb := quiet
	fb.OnError, fb.Fallback = httplimit.UseFallback, fallback
	withFallback, err := httplimit.NewGuard(fb)
	if err != nil {
		t.Fatal(err)
	}
	open := quiet
	open.OnError = httplimit.FailOpen
	failOpen, err := httplimit.NewGuard(open)
	if err != nil {
		t.Fatal(err)
	}

	// The server span the guard runs in.
	ctx, server := p.tp.Tracer("test").Start(context.Background(), "GET /quote")
	storeDown := errors.New("redis: connection refused")
	slow := fmt.Errorf("redis: i/o timeout: %w", context.DeadlineExceeded)
	steps := []struct {
		g      *httplimit.Guard
		fail   error
		status int
	}{
		{withFallback, nil, 0},   // allowed 1/3
		{withFallback, nil, 0},   // allowed 2/3
		{withFallback, nil, 0},   // allowed 3/3
		{withFallback, nil, 429}, // denied
		{withFallback, storeDown, 0},
		{withFallback, slow, 0},
		{withFallback, storeDown, 429}, // the fallback's burst of 2 is spent
		{failOpen, storeDown, 0},
	}
	for i, s := range steps {
		primary.set(s.fail)
		res := s.g.Check(ctx, ratekit.Request{Key: "203.0.113.7", Cost: 1}, http.Header{})
		if res.Status != s.status {
			t.Fatalf("step %d: status %d, want %d (err %v)", i, res.Status, s.status, res.Err)
		}
	}
	primary.set(nil)
	// A cost above the burst is an invalid request, not a store error.
	if _, err := observed.Allow(ctx, ratekit.Request{Key: "203.0.113.7", Cost: 4}); !errors.Is(err, ratekit.ErrInvalidRequest) {
		t.Fatalf("cost 4: %v, want ErrInvalidRequest", err)
	}
	// Peek and Refund are reported under their operation.
	if _, err := observed.(ratekit.Peeker).Peek(ctx, ratekit.Request{Key: "203.0.113.7", Cost: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := observed.(ratekit.Refunder).Refund(ctx, ratekit.Request{Key: "203.0.113.7", Cost: 1}); err != nil {
		t.Fatal(err)
	}
	server.End()

	const (
		redis = "ratekit.store=redis,ratekit.strategy=tokenbucket"
		local = "ratekit.store=memory,ratekit.strategy=tokenbucket"
	)
	diff(t, p.collect(t), map[string]int64{
		"ratekit.decisions{ratekit.operation=allow,ratekit.outcome=allowed,ratekit.policy=api," + redis + "}":                          3,
		"ratekit.decisions{ratekit.operation=allow,ratekit.outcome=denied,ratekit.policy=api," + redis + "}":                           1,
		"ratekit.decisions{error.type=store,ratekit.operation=allow,ratekit.outcome=error,ratekit.policy=api," + redis + "}":           3,
		"ratekit.decisions{error.type=deadline,ratekit.operation=allow,ratekit.outcome=error,ratekit.policy=api," + redis + "}":        1,
		"ratekit.decisions{error.type=invalid_request,ratekit.operation=allow,ratekit.outcome=error,ratekit.policy=api," + redis + "}": 1,
		"ratekit.decisions{ratekit.operation=peek,ratekit.outcome=denied,ratekit.policy=api," + redis + "}":                            1,
		"ratekit.decisions{ratekit.operation=refund,ratekit.outcome=allowed,ratekit.policy=api," + redis + "}":                         1,
		"ratekit.decisions{ratekit.operation=allow,ratekit.outcome=allowed,ratekit.policy=api-local," + local + "}":                    2,
		"ratekit.decisions{ratekit.operation=allow,ratekit.outcome=denied,ratekit.policy=api-local," + local + "}":                     1,
		"ratekit.decision.duration{ratekit.operation=allow,ratekit.outcome=allowed," + redis + "}":                                     3,
		"ratekit.decision.duration{ratekit.operation=allow,ratekit.outcome=denied," + redis + "}":                                      1,
		"ratekit.decision.duration{ratekit.operation=allow,ratekit.outcome=error," + redis + "}":                                       5,
		"ratekit.decision.duration{ratekit.operation=peek,ratekit.outcome=denied," + redis + "}":                                       1,
		"ratekit.decision.duration{ratekit.operation=refund,ratekit.outcome=allowed," + redis + "}":                                    1,
		"ratekit.decision.duration{ratekit.operation=allow,ratekit.outcome=allowed," + local + "}":                                     2,
		"ratekit.decision.duration{ratekit.operation=allow,ratekit.outcome=denied," + local + "}":                                      1,
		"ratekit.store.errors{error.type=store,ratekit.policy=api," + redis + "}":                                                      3,
		"ratekit.store.errors{error.type=deadline,ratekit.policy=api," + redis + "}":                                                   1,
		"ratekit.failure_policy.events{error.type=store,ratekit.failure_policy.action=fallback,ratekit.policy=api}":                    2,
		"ratekit.failure_policy.events{error.type=deadline,ratekit.failure_policy.action=fallback,ratekit.policy=api}":                 1,
		"ratekit.failure_policy.events{error.type=store,ratekit.failure_policy.action=fail_open,ratekit.policy=api}":                   1,
	})

	// One span per limiter call, children of the server span; the failure
	// policy's actions are events on the server span.
	var names []string
	var serverSpan sdktrace.ReadOnlySpan
	for _, s := range p.spans.Ended() {
		if s.Name() == "GET /quote" {
			serverSpan = s
			continue
		}
		names = append(names, s.Name())
		if s.Parent().SpanID() != server.SpanContext().SpanID() {
			t.Errorf("span %s is not a child of the server span", s.Name())
		}
		attrs := attribute.NewSet(s.Attributes()...)
		outcome, _ := attrs.Value(otelratekit.OutcomeKey)
		errType, hasErr := attrs.Value(otelratekit.ErrorTypeKey)
		if (outcome.AsString() == "error") != hasErr || (s.Status().Code == codes.Error) != hasErr {
			t.Errorf("span %s: outcome %q, error.type %q, status %v", s.Name(), outcome.AsString(), errType.AsString(), s.Status())
		}
		if hasErr && s.Status().Description != errType.AsString() {
			t.Errorf("span %s: status description %q, want the error type %q", s.Name(), s.Status().Description, errType.AsString())
		}
		if cost, ok := attrs.Value(otelratekit.CostKey); !ok || cost.AsInt64() < 1 {
			t.Errorf("span %s: ratekit.cost %v", s.Name(), cost.AsInt64())
		}
		if st, _ := attrs.Value(otelratekit.StrategyKey); st.AsString() != "tokenbucket" {
			t.Errorf("span %s: strategy %q", s.Name(), st.AsString())
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), "203.0.113.7") || strings.Contains(kv.Value.String(), "refused") {
				t.Errorf("span %s leaks %s=%s", s.Name(), kv.Key, kv.Value.String())
			}
		}
		if len(s.Events()) != 0 {
			t.Errorf("span %s has events %v (error text must not be recorded)", s.Name(), s.Events())
		}
	}
	wantNames := slices.Repeat([]string{"ratekit.allow"}, 9+3)
	wantNames = append(wantNames, "ratekit.peek", "ratekit.refund")
	slices.Sort(names)
	slices.Sort(wantNames)
	if !slices.Equal(names, wantNames) {
		t.Errorf("spans %v, want %v", names, wantNames)
	}
	if serverSpan == nil {
		t.Fatal("server span not recorded")
	}
	var actions []string
	for _, ev := range serverSpan.Events() {
		if ev.Name != "ratekit.failure_policy" {
			t.Errorf("server span event %q", ev.Name)
		}
		set := attribute.NewSet(ev.Attributes...)
		a, _ := set.Value(otelratekit.FailurePolicyActionKey)
		actions = append(actions, a.AsString())
	}
	if want := []string{"fallback", "fallback", "fallback", "fail_open"}; !slices.Equal(actions, want) {
		t.Errorf("failure-policy span events %v, want %v", actions, want)
	}
}

// TestNoSpans pins that NoSpans records metrics and no span.
func TestNoSpans(t *testing.T) {
	p := newProviders()
	o, err := otelratekit.NewObserver(otelratekit.Config{MeterProvider: p.mp, TracerProvider: p.tp, NoSpans: true})
	if err != nil {
		t.Fatal(err)
	}
	if o.DecisionStart != nil {
		t.Fatal("DecisionStart is set with NoSpans")
	}
	l := ratekit.Observe(bucket(t, "api", 1), o)
	for range 2 {
		l.Allow(context.Background(), ratekit.Request{Key: "k", Cost: 1})
	}
	if n := len(p.spans.Ended()) + len(p.spans.Started()); n != 0 {
		t.Fatalf("%d spans with NoSpans", n)
	}
	diff(t, p.collect(t), map[string]int64{
		"ratekit.decisions{ratekit.operation=allow,ratekit.outcome=allowed,ratekit.policy=api}": 1,
		"ratekit.decisions{ratekit.operation=allow,ratekit.outcome=denied,ratekit.policy=api}":  1,
		"ratekit.decision.duration{ratekit.operation=allow,ratekit.outcome=allowed}":            1,
		"ratekit.decision.duration{ratekit.operation=allow,ratekit.outcome=denied}":             1,
	})
}

// TestConcurrentCounts pins exact counts under concurrency: every decision
// is counted once.
func TestConcurrentCounts(t *testing.T) {
	p := newProviders()
	l := ratekit.Observe(bucket(t, "api", 100), p.observer(t, "", ""))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 50 {
				l.Allow(context.Background(), ratekit.Request{Key: fmt.Sprint("k", g%2), Cost: 1})
			}
		})
	}
	wg.Wait()
	diff(t, p.collect(t), map[string]int64{
		"ratekit.decisions{ratekit.operation=allow,ratekit.outcome=allowed,ratekit.policy=api}": 200,
		"ratekit.decisions{ratekit.operation=allow,ratekit.outcome=denied,ratekit.policy=api}":  200,
		"ratekit.decision.duration{ratekit.operation=allow,ratekit.outcome=allowed}":            200,
		"ratekit.decision.duration{ratekit.operation=allow,ratekit.outcome=denied}":             200,
	})
	if n := len(p.spans.Ended()); n != 400 {
		t.Fatalf("%d spans, want 400", n)
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
