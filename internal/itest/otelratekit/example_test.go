package otelratekit_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/otelratekit"
	"github.com/ratekit/ratekit/tokenbucket"
)

// Three requests through a limit of two, read back with a ManualReader.
func Example_manualReader() {
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
	mw, err := httplimit.Middleware(httplimit.MiddlewareConfig{
		GuardConfig: httplimit.GuardConfig{Limiter: ratekit.Observe(bucket, obs), OnError: httplimit.FailClosed, Observer: obs},
		Key:         httplimit.RemoteAddrKey(),
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
