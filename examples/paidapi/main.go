// Command paidapi is a paid API on AWS Lambda behind an API Gateway HTTP
// API that sells three plans, each a burst and a monthly quota counted
// exactly in PostgreSQL by ratekit's durable strategy:
//
//	free        2 calls a second,      1,000 a month
//	pro        10 calls a second,    100,000 a month
//	enterprise 50 calls a second, a monthly quota per customer
//
// A month runs from each customer's billing day (its billing anchor). The
// plan is resolved per request from the API key (durable.Planned), so a
// plan change takes effect on the customer's next call and keeps what was
// used this month. GET /v1/quote?symbol=ACME is the metered call; GET
// /usage reports what the key used of each policy; POST /admin/plan changes
// a customer's plan (with the admin token). A call whose downstream work
// fails is refunded, and a retried call that sends the same
// Idempotency-Key header is charged once; the handler deletes expired
// idempotency records itself, at most every 10 minutes per instance (see
// cleaner in cleanup.go).
//
// On Lambda (provided.al2023) it reads:
//
//	DATABASE_URL         PostgreSQL connection string (required)
//	PAIDAPI_KEYS         the customers: key[=plan][@billing-anchor], comma-separated (required)
//	PAIDAPI_ADMIN_TOKEN  bearer token of POST /admin/plan (optional; without it the route is off)
//
// With -local it serves the same handler over plain HTTP, translating each
// request into the HTTP API event that API Gateway would send, so it can be
// tried with curl against any PostgreSQL. From the repository root (the
// examples are a module of their own):
//
//	DATABASE_URL='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' PAIDAPI_KEYS=demo-key \
//	  go -C examples run ./paidapi -local -addr 127.0.0.1:8080
//	curl -i -H 'X-Api-Key: demo-key' -H 'Idempotency-Key: 1' 'http://127.0.0.1:8080/v1/quote?symbol=ACME'
//
// Started without -local outside Lambda, it says so and exits with status 2.
//
// When PostgreSQL fails (unreachable, wrong database or user, slower than
// 2 s), every call is refused with 503 and Retry-After, and the log says
// why: the first failure at once with its error, then at most one line per
// 30 s with the number of failures since, and a line when it answers again.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	awslambda "github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/examples/internal/apigwlocal"
	"github.com/ratekit/ratekit/examples/internal/cli"
	"github.com/ratekit/ratekit/examples/internal/lambdaenv"
	"github.com/ratekit/ratekit/examples/internal/plans"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil)
	stop()
	os.Exit(cli.Exit("paidapi", err, os.Stderr))
}

// notInLambdaHint is what paidapi says when it is started without -local
// outside Lambda.
const notInLambdaHint = "run with -local to serve on localhost"

// run sets the API up once and then serves: on Lambda through lambda.Start,
// with -local over HTTP until ctx ends. When ready is not nil it receives
// the local server's address.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("paidapi", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cli.SetUsage(fs, "paidapi [-local [-addr host:port]] "+plans.FlagsSynopsis,
		`Environment:
  DATABASE_URL         PostgreSQL connection string (required)
  PAIDAPI_KEYS         the customers, comma-separated (required): key[=plan][@anchor],
                       plan free (default), pro or enterprise:<monthly quota>,
                       anchor the billing anchor in RFC 3339 (default: months from the 1st, UTC)
  PAIDAPI_ADMIN_TOKEN  bearer token that POST /admin/plan requires (optional)

Without -local it must run in AWS Lambda (provided.al2023).
`)
	local := fs.Bool("local", false, "serve over plain HTTP instead of the Lambda runtime")
	addr := cli.String(fs, "addr", "127.0.0.1:8080", "`host:port` to listen on with -local", func(v string) error {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return errors.New("must be host:port, such as 127.0.0.1:8080")
		}
		return nil
	})
	flags := plans.Flags(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if !*local {
		// Before anything else: outside Lambda, lambda.Start would fail
		// with a message that does not mention -local.
		if err := lambdaenv.Check(getenv, notInLambdaHint); err != nil {
			return err
		}
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
	// When it stays unreachable, the first call logs why (see newAPI).
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		return err
	}
	// The seam: a real program reads its customers table here (see
	// plans.Customers).
	keys, err := plans.ParseKeys(getenv("PAIDAPI_KEYS"))
	if err != nil {
		return err
	}
	cust := plans.NewMemory(keys)
	tiers, prefix := flags()
	a, err := newAPI(config{
		store: store, prefix: prefix, tiers: tiers, customers: cust, adminToken: getenv("PAIDAPI_ADMIN_TOKEN"), logger: logger,
	})
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
	logger.Info("paid API listening", append([]any{"addr", "http://" + ln.Addr().String()},
		append(tiers.Describe(), "admin", a.cfg.adminToken != "")...)...)
	if ready != nil {
		ready <- ln.Addr().String()
	}
	return apigwlocal.Serve(ctx, ln, apigwlocal.Handler(a.handler), logger)
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
