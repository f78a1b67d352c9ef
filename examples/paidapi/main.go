// Command paidapi is a paid API tier on AWS Lambda behind an API Gateway HTTP
// API: each API key may make 1000 calls a day (UTC), counted exactly in
// PostgreSQL by ratekit's durable strategy, and at most 10 a second (a token
// bucket next to the daily quota; both policies decide every call together
// in one statement through durable.NewComposite, and both show in the
// RateLimit fields). A call whose
// downstream work fails is refunded, and a retried call that sends the same
// Idempotency-Key header is charged once.
//
// On Lambda (provided.al2023) it reads:
//
//	DATABASE_URL   PostgreSQL connection string (required)
//	PAIDAPI_KEYS   comma-separated API keys of the customers (required)
//
// With -local it serves the same handler over plain HTTP, translating each
// request into the HTTP API event that API Gateway would send, so it can be
// tried with curl against any PostgreSQL:
//
//	DATABASE_URL=postgres://postgres@127.0.0.1/test PAIDAPI_KEYS=demo-key \
//	  go run ./examples/paidapi -local -addr 127.0.0.1:8080
//	curl -i -H 'X-Api-Key: demo-key' -H 'Idempotency-Key: 1' 'http://127.0.0.1:8080/v1/quote?symbol=ACME'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	awslambda "github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratekit/ratekit/durable/pgstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "paidapi:", err)
		os.Exit(1)
	}
}

// run sets the API up once and then serves: on Lambda through lambda.Start,
// with -local over HTTP until ctx ends. When ready is not nil it receives
// the local server's address.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("paidapi", flag.ContinueOnError)
	fs.SetOutput(stderr)
	local := fs.Bool("local", false, "serve over plain HTTP instead of the Lambda runtime")
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on with -local")
	quota := fs.Int64("quota", 1000, "calls per API key and UTC day")
	burst := fs.Int64("burst", 10, "calls per API key and second")
	prefix := fs.String("prefix", policyName, "counter prefix in the shared ratekit tables")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := slog.New(slog.NewJSONHandler(stderr, nil))

	dsn := getenv("DATABASE_URL")
	if dsn == "" {
		return errors.New("DATABASE_URL is not set")
	}
	concurrency := lambdacontext.MaxConcurrency()
	if *local {
		concurrency = 0 // pgxpool's default for a long-running server
	}
	pcfg, err := poolConfig(dsn, concurrency)
	if err != nil {
		return err
	}
	// NewWithConfig does not connect: the first call does, so a database
	// that is briefly unreachable at init does not crash the instance.
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		return err
	}
	var keys []string
	for _, k := range strings.Split(getenv("PAIDAPI_KEYS"), ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	a, err := newAPI(config{store: store, prefix: *prefix, quota: *quota, burst: *burst, keys: keys, logger: logger})
	if err != nil {
		return err
	}
	if !*local {
		awslambda.StartWithOptions(a.handler, awslambda.WithContext(ctx))
		return nil
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           httpAPIServer(a.handler),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("paid API listening", "addr", "http://"+ln.Addr().String(), "quota", *quota, "burst", *burst)
	if ready != nil {
		ready <- ln.Addr().String()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Requests in flight get 5 s to finish. A connection still open then
	// (a request still running, or a socket a browser opened ahead of time
	// and never used, which the server counts as busy for its first 5 s)
	// is closed: stopping is not a failure.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); errors.Is(err, context.DeadlineExceeded) {
		logger.Warn("closing connections still open after 5 s")
		if err := srv.Close(); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// poolConfig parses dsn and sizes the pool for a function instance that runs
// concurrency invocations at once (lambdacontext.MaxConcurrency(): 1 on
// standard Lambda), unless the DSN sets pool_max_conns itself; 0 keeps
// pgxpool's defaults. pgstore.ServerlessPoolConfig keeps a frozen and thawed
// instance working within the Guard's timeout: it pings connections idle for
// more than a second, frees a broken connection's slot at once and retires
// idle connections before a NAT or load balancer drops them silently.
func poolConfig(dsn string, concurrency int) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	if concurrency > 0 && !strings.Contains(dsn, "pool_max_conns") {
		// One decision (and at most one refund) per invocation at a time.
		cfg.MaxConns = int32(concurrency)
		cfg.MinConns = 0
	}
	return pgstore.ServerlessPoolConfig(cfg, decisionTimeout), nil
}
