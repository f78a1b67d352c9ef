// Package otelratekit reports what ratekit limiters decide as OpenTelemetry
// metrics and spans. It is a module of its own, so the OpenTelemetry API
// enters a program's dependencies only when the program imports this package.
//
// [NewObserver] returns a [ratekit.Observer]: pass it to [ratekit.Observe] to
// observe a limiter's decisions and to httplimit.GuardConfig (field
// Observer) for the failure policy's events:
//
//	obs, err := otelratekit.NewObserver(otelratekit.Config{Strategy: "tokenbucket", Store: "redis"})
//	...
//	guard, err := httplimit.NewGuard(httplimit.GuardConfig{
//		Limiter:  ratekit.Observe(redisBucket, obs),
//		OnError:  httplimit.UseFallback,
//		Fallback: ratekit.Observe(memoryBucket, localObs),
//		Observer: obs,
//	})
//
// examples/cloudrun in ratekit's repository is a whole Cloud Run function
// that exports both through OTLP to a collector sidecar.
//
// # Metrics
//
// Names, units and attributes follow the OpenTelemetry semantic-convention
// style. Every attribute takes few values: keys, client state and error
// messages never become attributes.
//
//   - ratekit.decisions (counter, {decision}): every Allow, Peek and Refund,
//     with ratekit.policy, ratekit.operation (allow, peek, refund),
//     ratekit.outcome (allowed, denied, error), ratekit.strategy,
//     ratekit.store and, for errors, error.type.
//   - ratekit.decision.duration (histogram, s): the limiter's wall time per
//     call, with ratekit.strategy, ratekit.store, ratekit.operation and
//     ratekit.outcome.
//   - ratekit.store.errors (counter, {error}): calls that failed because the
//     store failed (error.type "store") or was too slow for the time given
//     (error.type "deadline"), with ratekit.policy, ratekit.strategy and
//     ratekit.store. Invalid requests and callers that gave up
//     (error.type "canceled") are not store errors; ratekit.decisions counts
//     them.
//   - ratekit.failure_policy.events (counter, {event}): each time a Guard's
//     failure policy acted, with ratekit.policy,
//     ratekit.failure_policy.action (fail_open, fail_closed, fallback) and
//     error.type.
//
// ratekit.strategy and ratekit.store are [Config.Strategy] and
// [Config.Store], omitted when empty; error.type is
// [ratekit.ErrorClass.String] (invalid_request, canceled, deadline, store).
//
// # Spans
//
// Each observed limiter call is a span of kind internal named
// "ratekit.allow", "ratekit.peek" or "ratekit.refund", with ratekit.policy,
// ratekit.strategy, ratekit.store, ratekit.cost, ratekit.outcome and, on an
// error, error.type and status Error (the error's text is not recorded: a
// store's message may quote a key). For store-backed strategies the span
// covers the store round trip; its context is the one the limiter's store
// client receives, so the client's own instrumentation nests under it:
// redisotel.InstrumentTracing on the go-redis client
// (github.com/redis/go-redis/extra/redisotel/v9), or an OpenTelemetry
// pgx.QueryTracer set as ConnConfig.Tracer on the pgx pool (for example
// github.com/exaring/otelpgx). A failure-policy event is also added as the
// span event "ratekit.failure_policy" to the span in the Guard's context
// (normally the HTTP server span).
package otelratekit

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratekit/ratekit"
)

// ScopeName is the instrumentation scope under which the Meter and Tracer
// report.
const ScopeName = "github.com/ratekit/ratekit/otelratekit"

// Attribute keys this package sets.
const (
	PolicyKey              = attribute.Key("ratekit.policy")
	OperationKey           = attribute.Key("ratekit.operation")
	OutcomeKey             = attribute.Key("ratekit.outcome")
	StrategyKey            = attribute.Key("ratekit.strategy")
	StoreKey               = attribute.Key("ratekit.store")
	CostKey                = attribute.Key("ratekit.cost")
	FailurePolicyActionKey = attribute.Key("ratekit.failure_policy.action")
	ErrorTypeKey           = attribute.Key("error.type")
)

// Config configures [NewObserver]. The zero Config uses the global
// providers and sets no strategy or store attribute.
type Config struct {
	// MeterProvider provides the Meter. Nil means otel.GetMeterProvider().
	MeterProvider metric.MeterProvider

	// TracerProvider provides the Tracer. Nil means
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider

	// NoSpans turns spans off: the observer records metrics only.
	NoSpans bool

	// Strategy is the ratekit.strategy attribute of the observed limiter's
	// metrics and spans, for example "tokenbucket", "durable" or
	// "signedwindow". Empty omits the attribute. Use one observer per
	// limiter when they differ.
	Strategy string

	// Store is the ratekit.store attribute, for example "redis",
	// "postgresql" or "memory". Empty omits the attribute.
	Store string
}

// NewObserver returns a [ratekit.Observer] that records ratekit's metrics
// and spans (see the package documentation) through cfg's providers. It
// returns an error when an instrument cannot be created. The Observer is
// safe for concurrent use; observers built from the same providers share
// their instruments.
func NewObserver(cfg Config) (*ratekit.Observer, error) {
	mp, tp := cfg.MeterProvider, cfg.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(ScopeName)
	o := &observer{tracer: tp.Tracer(ScopeName), sets: map[setKey]*measureOpts{}}
	var err error
	if o.decisions, err = m.Int64Counter("ratekit.decisions",
		metric.WithUnit("{decision}"),
		metric.WithDescription("Limiter calls (Allow, Peek, Refund) by policy and outcome.")); err != nil {
		return nil, fmt.Errorf("otelratekit: %w", err)
	}
	if o.duration, err = m.Float64Histogram("ratekit.decision.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Wall time of limiter calls, store round trip included."),
		metric.WithExplicitBucketBoundaries(0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
			0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)); err != nil {
		return nil, fmt.Errorf("otelratekit: %w", err)
	}
	if o.storeErrors, err = m.Int64Counter("ratekit.store.errors",
		metric.WithUnit("{error}"),
		metric.WithDescription("Limiter calls that failed because the store failed or was too slow.")); err != nil {
		return nil, fmt.Errorf("otelratekit: %w", err)
	}
	if o.failures, err = m.Int64Counter("ratekit.failure_policy.events",
		metric.WithUnit("{event}"),
		metric.WithDescription("Failure-policy actions of a Guard: fail_open, fail_closed, fallback.")); err != nil {
		return nil, fmt.Errorf("otelratekit: %w", err)
	}
	if cfg.Strategy != "" {
		o.common = append(o.common, StrategyKey.String(cfg.Strategy))
	}
	if cfg.Store != "" {
		o.common = append(o.common, StoreKey.String(cfg.Store))
	}
	obs := &ratekit.Observer{Decision: o.decision, FailurePolicy: o.failurePolicy}
	if !cfg.NoSpans {
		o.spans = true
		obs.DecisionStart = o.start
	}
	return obs, nil
}

type observer struct {
	tracer                           trace.Tracer
	spans                            bool
	decisions, storeErrors, failures metric.Int64Counter
	duration                         metric.Float64Histogram
	common                           []attribute.KeyValue // strategy, store

	mu   sync.RWMutex
	sets map[setKey]*measureOpts
}

// setKey identifies one combination of attribute values. Every field takes
// few values, so the cache stays small.
type setKey struct {
	kind    uint8 // decision or failure
	policy  string
	op      ratekit.Op
	outcome ratekit.Outcome
	class   ratekit.ErrorClass
	action  ratekit.FailureAction
}

const (
	kindDecision uint8 = iota
	kindFailure
)

// measureOpts are the measurement options of one attribute combination,
// built once: building an attribute set on every call would allocate.
type measureOpts struct {
	count    []metric.AddOption    // ratekit.decisions or failure events
	storeErr []metric.AddOption    // ratekit.store.errors
	duration []metric.RecordOption // ratekit.decision.duration
	event    []attribute.KeyValue  // span attributes at the end
}

func (o *observer) opts(k setKey) *measureOpts {
	o.mu.RLock()
	m := o.sets[k]
	o.mu.RUnlock()
	if m != nil {
		return m
	}
	m = o.build(k)
	o.mu.Lock()
	if prev := o.sets[k]; prev != nil {
		m = prev
	} else {
		o.sets[k] = m
	}
	o.mu.Unlock()
	return m
}

func (o *observer) build(k setKey) *measureOpts {
	m := &measureOpts{}
	policy := PolicyKey.String(k.policy)
	if k.kind == kindFailure {
		attrs := []attribute.KeyValue{policy, FailurePolicyActionKey.String(k.action.String()), ErrorTypeKey.String(k.class.String())}
		m.count = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
		m.event = attrs
		return m
	}
	op, outcome := OperationKey.String(k.op.String()), OutcomeKey.String(k.outcome.String())
	count := append([]attribute.KeyValue{policy, op, outcome}, o.common...)
	if k.class != ratekit.ErrorNone {
		count = append(count, ErrorTypeKey.String(k.class.String()))
		m.event = []attribute.KeyValue{outcome, ErrorTypeKey.String(k.class.String())}
	} else {
		m.event = []attribute.KeyValue{outcome}
	}
	m.count = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(count...))}
	dur := append([]attribute.KeyValue{op, outcome}, o.common...)
	m.duration = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(dur...))}
	if k.class == ratekit.ErrorStore || k.class == ratekit.ErrorDeadline {
		se := append([]attribute.KeyValue{policy, ErrorTypeKey.String(k.class.String())}, o.common...)
		m.storeErr = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(se...))}
	}
	return m
}

var spanNames = [...]string{ratekit.OpAllow: "ratekit.allow", ratekit.OpPeek: "ratekit.peek", ratekit.OpRefund: "ratekit.refund"}

func (o *observer) start(ctx context.Context, e ratekit.DecisionStartEvent) context.Context {
	name := "ratekit.unknown"
	if int(e.Op) < len(spanNames) && spanNames[e.Op] != "" {
		name = spanNames[e.Op]
	}
	ctx, span := o.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
	if span.IsRecording() {
		span.SetAttributes(PolicyKey.String(e.Policy), CostKey.Int64(e.Cost))
		span.SetAttributes(o.common...)
	}
	return ctx
}

func (o *observer) decision(ctx context.Context, e ratekit.DecisionEvent) {
	m := o.opts(setKey{kind: kindDecision, policy: e.Policy, op: e.Op, outcome: e.Outcome, class: e.ErrorClass})
	o.decisions.Add(ctx, 1, m.count...)
	o.duration.Record(ctx, e.Duration.Seconds(), m.duration...)
	if m.storeErr != nil {
		o.storeErrors.Add(ctx, 1, m.storeErr...)
	}
	if !o.spans {
		return
	}
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		if e.Policy != "" {
			span.SetAttributes(PolicyKey.String(e.Policy))
		}
		span.SetAttributes(m.event...)
		if e.Outcome == ratekit.OutcomeError {
			span.SetStatus(codes.Error, e.ErrorClass.String())
		}
	}
	span.End()
}

func (o *observer) failurePolicy(ctx context.Context, e ratekit.FailureEvent) {
	m := o.opts(setKey{kind: kindFailure, policy: e.Policy, class: e.ErrorClass, action: e.Action})
	o.failures.Add(ctx, 1, m.count...)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("ratekit.failure_policy", trace.WithAttributes(m.event...))
	}
}
