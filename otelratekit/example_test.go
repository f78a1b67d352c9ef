package otelratekit_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/otelratekit"
	"github.com/ratekit/ratekit/tokenbucket"
)

// A Cloud Run service exports to the OpenTelemetry Collector running as a
// sidecar (OTLP over HTTP on localhost:4318), which forwards to Cloud
// Monitoring and Cloud Trace. The providers are built once per instance and
// flushed on SIGTERM, which Cloud Run sends before it stops an instance.
func ExampleNewObserver_cloudRun() {
	ctx := context.Background()
	mexp, err := otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpoint("localhost:4318"), otlpmetrichttp.WithInsecure())
	if err != nil {
		log.Fatal(err)
	}
	texp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint("localhost:4318"), otlptracehttp.WithInsecure())
	if err != nil {
		log.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp, sdkmetric.WithInterval(30*time.Second))))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(texp), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1))))
	otel.SetMeterProvider(mp)
	otel.SetTracerProvider(tp)
	defer mp.Shutdown(ctx) // in main: on SIGTERM, before exiting
	defer tp.Shutdown(ctx)

	// One observer per limiter, named by strategy and store; the global
	// providers are used.
	redisObs, err := otelratekit.NewObserver(otelratekit.Config{Strategy: "tokenbucket", Store: "redis"})
	if err != nil {
		log.Fatal(err)
	}
	localObs, err := otelratekit.NewObserver(otelratekit.Config{Strategy: "tokenbucket", Store: "memory"})
	if err != nil {
		log.Fatal(err)
	}
	client := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{os.Getenv("REDIS_ADDR")}}, 250*time.Millisecond))
	rstore, err := redisstore.New(client, redisstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	mstore, err := memstore.New(memstore.Config{MaxKeys: 100_000})
	if err != nil {
		log.Fatal(err)
	}
	bucket := func(store kvstore.Store) ratekit.Limiter {
		l, err := tokenbucket.New(tokenbucket.Config{Name: "quote", Burst: 5, RefillRate: tokenbucket.PerMinute(30), Mode: tokenbucket.Atomic, Store: store})
		if err != nil {
			log.Fatal(err)
		}
		return l
	}
	limit, err := ratekit.Middleware(ratekit.MiddlewareConfig{
		GuardConfig: ratekit.GuardConfig{
			Limiter:  ratekit.Observe(bucket(rstore), redisObs),
			OnError:  ratekit.UseFallback,
			Fallback: ratekit.Observe(bucket(mstore), localObs),
			Observer: redisObs,
			Timeout:  300 * time.Millisecond,
		},
		Key: ratekit.RemoteAddrKey(),
	})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "quote") })))
	// Then serve it: http.ListenAndServe(":"+os.Getenv("PORT"), nil).
}

// Three requests through a limit of two, read back with a ManualReader.
func ExampleNewObserver() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs, err := otelratekit.NewObserver(otelratekit.Config{MeterProvider: mp, NoSpans: true, Strategy: "tokenbucket", Store: "memory"})
	if err != nil {
		log.Fatal(err)
	}
	store, _ := memstore.New(memstore.Config{MaxKeys: 1000})
	bucket, err := tokenbucket.New(tokenbucket.Config{Name: "quote", Burst: 2, RefillRate: tokenbucket.PerHour(1), Mode: tokenbucket.Atomic, Store: store})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := ratekit.Middleware(ratekit.MiddlewareConfig{
		GuardConfig: ratekit.GuardConfig{Limiter: ratekit.Observe(bucket, obs), OnError: ratekit.FailClosed, Observer: obs},
		Key:         ratekit.RemoteAddrKey(),
	})
	if err != nil {
		log.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 3 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}

	var rm metricdata.ResourceMetrics
	reader.Collect(context.Background(), &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "ratekit.decisions" {
			for _, dp := range sum.DataPoints {
				outcome, _ := dp.Attributes.Value(otelratekit.OutcomeKey)
				fmt.Println(m.Name, outcome.AsString(), dp.Value)
			}
		}
	}
	// Unordered output:
	// ratekit.decisions allowed 2
	// ratekit.decisions denied 1
}
