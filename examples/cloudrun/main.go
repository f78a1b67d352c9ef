// Command cloudrun is a Cloud Run function written with Google's Functions
// Framework for Go: an HTTP function registered in init() under the name
// "Quote" and served by funcframework, limited per client by ratekit's
// root net/http middleware with a token bucket (burst 5, refilled at 30 a
// minute).
//
// With $REDIS_URL set (for example redis://10.0.0.3:6379/0, a Memorystore
// instance reached through a VPC connector) every instance shares the
// buckets in Redis, updated atomically by one script per request; if Redis
// fails, each instance falls back to buckets of its own in memory. Without
// $REDIS_URL the buckets live in the instance's memory, which is exact for
// one instance and per instance otherwise.
//
// Run it locally the way Cloud Run runs it:
//
//	FUNCTION_TARGET=Quote PORT=8080 go -C examples run ./cloudrun
//	curl -i localhost:8080/
//
// $FUNCTION_TARGET selects the function, $PORT the port (default 8080). The
// program serves one function, Quote, at /, also when $FUNCTION_TARGET is
// unset, and logs one line at start that says so. It takes no flags but -h.
//
// When Redis fails, the first failure is logged at once with its cause, and
// then at most one line every 10 seconds with the number of requests that
// the in-memory buckets decided meanwhile, never a line per request.
//
// On Cloud Run ($K_SERVICE is set) clients are keyed by the address the
// Google front end appends to X-Forwarded-For; locally by the connection's
// address. $TRUSTED_PROXIES overrides the number of trusted proxies.
//
// With $OTEL_EXPORTER_OTLP_ENDPOINT set (on Cloud Run, http://localhost:4318,
// the OpenTelemetry Collector sidecar) every decision is exported over
// OTLP/HTTP by otelratekit: the metrics ratekit.decisions,
// ratekit.decision.duration, ratekit.store.errors and
// ratekit.failure_policy.events, and a span per limiter call, for the Redis
// bucket and the in-memory fallback apart (ratekit.store). The exporters
// read the standard OTEL_* variables; SIGTERM flushes them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/otelratekit"
)

// target is the name of the one function this program registers and
// serves.
const target = "Quote"

// logger writes JSON lines to stderr, which Cloud Logging reads.
var logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))

// init builds the limiter once per instance and registers the function, as
// a Cloud Run function's package does.
func init() {
	observe, shutdown, err := setupTelemetry(context.Background(), os.Getenv)
	if err != nil {
		log.Fatalf("cloudrun: OpenTelemetry: %v", err)
	}
	shutdownTelemetry = shutdown
	f, err := newFunction(os.Getenv, observe, logger)
	if err != nil {
		log.Fatalf("cloudrun: %v", err)
	}
	functions.HTTP(target, f.ServeHTTP)
}

// shutdownTelemetry flushes the metrics and spans not yet exported.
var shutdownTelemetry func(context.Context) error

func main() {
	switch err := parseArgs(os.Args[1:], os.Stderr); {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		os.Exit(2) // the error and the usage are printed
	}
	// funcframework serves $FUNCTION_TARGET at /; without it, it would
	// serve each function at its own path (/Quote) and / would be 404.
	switch t := os.Getenv("FUNCTION_TARGET"); t {
	case "":
		os.Setenv("FUNCTION_TARGET", target)
	case target:
	default:
		log.Fatalf("cloudrun: FUNCTION_TARGET is %q; this program serves one function, %q", t, target)
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	// Cloud Run sends SIGTERM and allows 10 seconds before it stops the
	// instance: flush the telemetry and exit.
	go func() {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		<-ctx.Done()
		stop()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdownTelemetry(ctx); err != nil {
			log.Printf("cloudrun: OpenTelemetry: %v", err)
		}
		os.Exit(0)
	}()
	// An empty host listens on every interface, as Cloud Run requires.
	logger.Info(fmt.Sprintf("cloudrun: serving function %q at / on port %s", target, port), "function", target, "port", port)
	if err := funcframework.StartHostPort(os.Getenv("HOST"), port); err != nil {
		log.Fatalf("cloudrun: %v", err)
	}
}

// parseArgs refuses every argument but -h (or -help), which prints the usage
// to stderr and returns flag.ErrHelp: the program is configured by its
// environment, as Cloud Run configures it. The flag package prints what
// it refuses, with the usage.
func parseArgs(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("cloudrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: cloudrun

Serves the Cloud Run function Quote at /, limited per client by a token
bucket (burst 5, 30 a minute). It takes no flags; the environment sets it up:

  PORT             port to listen on (default 8080); HOST, the interface
  FUNCTION_TARGET  the function to serve: Quote (the default)
  REDIS_URL        redis:// or rediss:// URL of the Redis the instances share
                   (default: buckets in each instance's memory)
  REDIS_PREFIX     prefix of the Redis keys (default "ratekit:")
  K_SERVICE        set on Cloud Run: clients keyed by X-Forwarded-For
  TRUSTED_PROXIES  proxies that append to X-Forwarded-For (1 on Cloud Run)
  OTEL_EXPORTER_OTLP_ENDPOINT  export metrics and spans over OTLP/HTTP
`)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected argument %q", fs.Arg(0))
		fmt.Fprintln(stderr, err)
		fs.Usage()
		return err
	}
	return nil
}

// setupTelemetry exports ratekit's metrics and spans over OTLP/HTTP when
// $OTEL_EXPORTER_OTLP_ENDPOINT is set: on Cloud Run, to the OpenTelemetry
// Collector sidecar (http://localhost:4318), which forwards them to Cloud
// Monitoring and Cloud Trace. The exporters read the standard OTEL_*
// variables (endpoint, headers, interval); $OTEL_TRACES_SAMPLER and its
// argument choose the sampled share of spans. Without the endpoint it
// observes nothing. shutdown flushes what is buffered; call it when Cloud
// Run sends SIGTERM.
func setupTelemetry(ctx context.Context, getenv func(string) string) (observe observeFunc, shutdown func(context.Context) error, err error) {
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
		return nil, func(context.Context) error { return nil }, nil
	}
	mexp, err := otlpmetrichttp.New(ctx)
	if err != nil {
		return nil, nil, err
	}
	texp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp)))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(texp))
	otel.SetMeterProvider(mp)
	otel.SetTracerProvider(tp)
	observe = func(strategy, store string) (*ratekit.Observer, error) {
		return otelratekit.NewObserver(otelratekit.Config{MeterProvider: mp, TracerProvider: tp, Strategy: strategy, Store: store})
	}
	shutdown = func(ctx context.Context) error {
		return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx))
	}
	return observe, shutdown, nil
}
