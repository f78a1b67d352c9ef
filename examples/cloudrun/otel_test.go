package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// With $OTEL_EXPORTER_OTLP_ENDPOINT set, the function's decisions reach an
// OTLP/HTTP receiver (here a stand-in for the collector sidecar) when the
// telemetry is flushed, as on SIGTERM.
func TestOTLPExport(t *testing.T) {
	var mu sync.Mutex
	bodies := map[string][]byte{}
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies[r.URL.Path] = append(bodies[r.URL.Path], b...)
		mu.Unlock()
	}))
	defer collector.Close()
	getenv := func(k string) string {
		if k == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			return collector.URL
		}
		return ""
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL) // read by the exporters
	observe, shutdown, err := setupTelemetry(context.Background(), getenv)
	if err != nil {
		t.Fatal(err)
	}
	f, err := newFunction(getenv, observe, nil)
	if err != nil {
		t.Fatal(err)
	}
	drain(t, install(t, "QuoteOTel", f))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for path, want := range map[string][]string{
		"/v1/metrics": {"ratekit.decisions", "ratekit.decision.duration", "ratekit.outcome", "denied", "tokenbucket", "quote"},
		"/v1/traces":  {"ratekit.allow", "ratekit.policy"},
	} {
		for _, w := range want {
			if !bytes.Contains(bodies[path], []byte(w)) {
				t.Errorf("%s: %q not exported (%d bytes received)", path, w, len(bodies[path]))
			}
		}
	}
}
