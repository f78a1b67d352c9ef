package otelratekit_test

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/otelratekit"
	"github.com/ratekit/ratekit/tokenbucket"
)

// benchLimiter is a token bucket in memory that always admits, the same as
// the root package's BenchmarkGuardObserve uses.
func benchLimiter(b *testing.B) ratekit.Limiter {
	store, err := memstore.New(memstore.Config{MaxKeys: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	l, err := tokenbucket.New(tokenbucket.Config{
		Name: "bench", Burst: 1 << 30, RefillRate: tokenbucket.PerSecond(1 << 20),
		Mode: tokenbucket.Atomic, Store: store,
	})
	if err != nil {
		b.Fatal(err)
	}
	return l
}

func benchGuard(b *testing.B, l ratekit.Limiter, o *ratekit.Observer) {
	g, err := httplimit.NewGuard(httplimit.GuardConfig{Limiter: ratekit.Observe(l, o), OnError: httplimit.FailOpen, Observer: o})
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req := ratekit.Request{Key: "10.0.0." + strconv.FormatInt(n.Add(1), 10), Cost: 1}
		h := http.Header{}
		ctx := context.Background()
		for pb.Next() {
			if res := g.Check(ctx, req, h); res.Status != 0 {
				b.Fatal(res.Status)
			}
		}
	})
}

// BenchmarkGuard measures Guard.Check on an in-memory token bucket with no
// observer, with the OpenTelemetry SDK recording metrics (a ManualReader,
// as a periodic exporter would, between its exports), and with metrics and
// a sampled span per decision (batched to an exporter that drops them).
func BenchmarkGuard(b *testing.B) {
	b.Run("none", func(b *testing.B) {
		benchGuard(b, benchLimiter(b), nil)
	})
	b.Run("otel-metrics", func(b *testing.B) {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		o, err := otelratekit.NewObserver(otelratekit.Config{MeterProvider: mp, NoSpans: true, Strategy: "tokenbucket", Store: "memory"})
		if err != nil {
			b.Fatal(err)
		}
		benchGuard(b, benchLimiter(b), o)
	})
	b.Run("otel-metrics-spans", func(b *testing.B) {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		defer tp.Shutdown(context.Background())
		o, err := otelratekit.NewObserver(otelratekit.Config{MeterProvider: mp, TracerProvider: tp, Strategy: "tokenbucket", Store: "memory"})
		if err != nil {
			b.Fatal(err)
		}
		benchGuard(b, benchLimiter(b), o)
	})
}
