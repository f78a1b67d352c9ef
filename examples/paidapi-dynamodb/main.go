// Command paidapi-dynamodb is a paid API on AWS Lambda with DynamoDB as its
// only store, no database or cache to run, size or keep warm. It sells the
// plans of examples/paidapi, each a burst and a monthly quota counted
// exactly from each customer's billing day:
//
//	free        2 calls a second,      1,000 a month
//	pro        10 calls a second,    100,000 a month
//	enterprise 50 calls a second, a monthly quota per customer
//
// tokenbucket.Planned decides a call's burst and month in one conditional
// UpdateItem on one item per customer (dynamostore, Group), all or
// nothing. The plan is resolved per request from the customers table
// (served from memory for 10 s), so a plan change takes effect within
// seconds and keeps what was used this month. GET /v1/quote?symbol=ACME is
// the metered call; GET /usage reports what the key used of each policy;
// POST /admin/plan changes a customer's plan (with the admin token). A call
// whose downstream work fails is refunded. When DynamoDB fails (throttled,
// unreachable, slower than 300 ms) the call is refused with 503 and
// Retry-After, and the log says why at once, then at most one line per 30 s.
//
// It reads:
//
//	RATEKIT_TABLE              the limiter's table (required; see template.yaml)
//	PAIDAPI_CUSTOMERS_TABLE    the customers table (required)
//	PAIDAPI_KEYS               customers to add at start, key[=plan][@billing-anchor],
//	                           comma-separated (optional; existing customers are kept)
//	PAIDAPI_ADMIN_TOKEN        bearer token of POST /admin/plan (optional; without it the route is off)
//	RATEKIT_DYNAMODB_ENDPOINT  a DynamoDB endpoint to use instead of AWS's (optional)
//
// The client comes from the AWS SDK's configuration loading
// (config.LoadDefaultConfig): region and credentials from the environment
// (on Lambda, the execution role's), and AWS_ENDPOINT_URL_DYNAMODB or
// AWS_ENDPOINT_URL when set; RATEKIT_DYNAMODB_ENDPOINT overrides them all.
//
// With -local it serves the same handler over plain HTTP, translating each
// request into the HTTP API event API Gateway would send, so that it can be
// tried against DynamoDB Local or dynalite (README.md). Started without
// -local outside Lambda, it says so and exits with status 2.
//
// template.yaml beside this file is the SAM template: the two tables, the
// function, and an IAM policy of the actions it calls. sam build runs
// examples/Makefile.
package main

import (
	"context"
	"encoding/json"
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
	"time"

	awslambda "github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/examples/internal/apigwlocal"
	"github.com/ratekit/ratekit/examples/internal/cli"
	"github.com/ratekit/ratekit/examples/internal/lambdaenv"
	"github.com/ratekit/ratekit/examples/internal/plans"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// EndpointEnv names a DynamoDB endpoint that overrides the SDK's (the
// variable ratekit's tests use to find theirs).
const EndpointEnv = "RATEKIT_DYNAMODB_ENDPOINT"

// defaultTimeout bounds a decision: slower, DynamoDB counts as failed.
const defaultTimeout = 300 * time.Millisecond

// maxAttempts is the most conditional writes a decision or refund makes on
// a customer's item (dynamostore.Config.MaxAttempts): each write that
// another call of the same customer beat costs a write unit and is tried
// again on the item as it now stands. Calls of one customer at once beyond
// it fail with 503 (a refund leaves the call charged), within the timeout.
const maxAttempts = 16

// addTimeout bounds the writes of PAIDAPI_KEYS's customers at start.
const addTimeout = 5 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, nil)
	stop()
	os.Exit(cli.Exit("paidapi-dynamodb", err, os.Stderr))
}

// run builds the client and the handler once and then serves: on Lambda
// through lambda.Start, with -local over HTTP until ctx ends; with -bill it
// prints the billing lines on stdout instead. When ready is not nil it
// receives the local server's address.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("paidapi-dynamodb", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cli.SetUsage(fs, "paidapi-dynamodb [-local [-addr host:port] [-create-table]] [-timeout duration] "+plans.FlagsSynopsis,
		`Environment:
  RATEKIT_TABLE              the limiter's DynamoDB table (required)
  PAIDAPI_CUSTOMERS_TABLE    the customers' DynamoDB table (required)
  PAIDAPI_KEYS               customers to add at start unless present, comma-separated:
                             key[=plan][@anchor], plan free (default), pro or
                             enterprise:<monthly quota>, anchor the billing anchor in
                             RFC 3339 (default: months from the 1st, UTC)
  PAIDAPI_ADMIN_TOKEN        bearer token that POST /admin/plan requires (optional)
  RATEKIT_DYNAMODB_ENDPOINT  DynamoDB endpoint, overriding AWS_ENDPOINT_URL_DYNAMODB
                             and AWS_ENDPOINT_URL (optional)
  AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...  as the AWS SDK reads them

Without -local it must run in AWS Lambda (provided.al2023).
`)
	local := fs.Bool("local", false, "serve over plain HTTP instead of the Lambda runtime")
	addr := cli.String(fs, "addr", "127.0.0.1:8080", "`host:port` to listen on with -local", func(v string) error {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return errors.New("must be host:port, such as 127.0.0.1:8080")
		}
		return nil
	})
	createTable := fs.Bool("create-table", false, "with -local, create RATEKIT_TABLE and PAIDAPI_CUSTOMERS_TABLE first if they do not exist (for DynamoDB Local or dynalite)")
	timeout := cli.Duration(fs, "timeout", defaultTimeout, time.Millisecond, time.Minute,
		"`bound` on each decision; DynamoDB slower than this fails the call with 503")
	bill := cli.String(fs, "bill", "", "print each key's monthly usage in the billing months that start in `from/to` (RFC 3339 times or dates, such as 2026-11-01/2026-12-01) as JSON lines, and exit", func(v string) error {
		_, _, err := parseSpan(v)
		return err
	})
	flags := plans.Flags(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *bill != "" && *local {
		return &cli.UsageError{Err: errors.New("-bill prints and exits: it does not go with -local")}
	}
	if *createTable && !*local {
		return &cli.UsageError{Err: errors.New("-create-table works with -local only: on AWS the tables come from template.yaml")}
	}
	if !*local && *bill == "" {
		// Before anything else: outside Lambda, lambda.Start would fail
		// with a message that does not mention -local.
		if err := lambdaenv.Check(getenv, "run with -local to serve on localhost"); err != nil {
			return err
		}
	}
	logger := slog.New(slog.NewJSONHandler(stderr, nil))
	client, err := newClient(ctx, getenv)
	if err != nil {
		return err
	}
	table, customersTable := getenv("RATEKIT_TABLE"), getenv("PAIDAPI_CUSTOMERS_TABLE")
	tiers, prefix := flags()
	switch {
	case table == "":
		return errors.New("RATEKIT_TABLE is not set")
	case *bill != "":
		from, to, _ := parseSpan(*bill)
		return billing(ctx, client, table, prefix, from, to, stdout)
	case customersTable == "":
		return errors.New("PAIDAPI_CUSTOMERS_TABLE is not set")
	}
	if *createTable {
		if err := createTables(ctx, client, table, customersTable, logger); err != nil {
			return err
		}
	}
	a, err := newAPI(config{
		client: client, table: table, customersTable: customersTable, prefix: prefix, tiers: tiers,
		timeout: *timeout, adminToken: getenv("PAIDAPI_ADMIN_TOKEN"), logger: logger,
	})
	if err != nil {
		return err
	}
	if keys := getenv("PAIDAPI_KEYS"); keys != "" {
		if err := addCustomers(ctx, a.customers, keys, logger); err != nil {
			return err
		}
	}
	if !*local {
		awslambda.StartWithOptions(a.Route, awslambda.WithContext(ctx))
		return nil
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	logger.Info("paid API listening", append([]any{"addr", "http://" + ln.Addr().String(), "table", table, "customers_table", customersTable},
		append(tiers.Describe(), "admin", a.cfg.adminToken != "")...)...)
	if ready != nil {
		ready <- ln.Addr().String()
	}
	return apigwlocal.Serve(ctx, ln, apigwlocal.Handler(a.Route), logger)
}

// parseSpan reads -bill's from/to: two RFC 3339 times or dates (UTC
// midnight), from before to.
func parseSpan(v string) (from, to time.Time, err error) {
	a, b, ok := strings.Cut(v, "/")
	if !ok {
		return from, to, errors.New("want from/to, such as 2026-11-01/2026-12-01")
	}
	parse := func(s string) (time.Time, error) {
		if t, err := time.Parse(time.DateOnly, s); err == nil {
			return t, nil
		}
		return time.Parse(time.RFC3339, s)
	}
	if from, err = parse(a); err != nil {
		return from, to, fmt.Errorf("from: want a date or an RFC 3339 time: %w", err)
	}
	if to, err = parse(b); err != nil {
		return from, to, fmt.Errorf("to: want a date or an RFC 3339 time: %w", err)
	}
	if !from.Before(to) {
		return from, to, errors.New("from must be before to")
	}
	return from, to, nil
}

// billingLine is a line of -bill's output: what a key used in one billing
// month. Key is the API key's hash (httplimit.APIKey), the customers
// table's api_key.
type billingLine struct {
	Key         string    `json:"api_key"`
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	Used        int64     `json:"used"`
}

// billing writes to w, as JSON lines, the monthly usage of every key whose
// billing month starts in [from, to), read by tokenbucket.Planned's
// PeriodUsage from the limiter's table under prefix: the ended months from
// their history items, the current ones as they stand.
func billing(ctx context.Context, client *dynamodb.Client, table, prefix string, from, to time.Time, w io.Writer) error {
	store, err := dynamostore.New(client, dynamostore.Config{Table: table})
	if err != nil {
		return fmt.Errorf("RATEKIT_TABLE: %w", err)
	}
	// PeriodUsage needs no plan: it reads the history of a policy name.
	limiter, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{
		Prefix: prefix, Store: store, Group: true,
		Plan: func(context.Context, string) (ratekit.Plan, error) {
			return ratekit.Plan{}, errors.New("-bill decides nothing")
		},
	})
	if err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	return limiter.PeriodUsage(ctx, plans.MonthlyPolicy, from, to, func(u ratekit.PeriodUsage) error {
		return enc.Encode(billingLine{Key: u.Key, PeriodStart: u.Start.UTC(), PeriodEnd: u.End.UTC(), Used: u.Used})
	})
}

// createTables creates the limiter's table and the customers table unless
// they exist, for a local DynamoDB.
func createTables(ctx context.Context, client *dynamodb.Client, table, customersTable string, logger *slog.Logger) error {
	tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := dynamostore.CreateTable(tctx, client, table)
	switch {
	case errors.Is(err, dynamostore.ErrNoTTL):
		// dynalite has no Time to Live: expired items stay, which a local
		// run does not mind (the store checks expiry on read).
		logger.Warn("table ready, but this DynamoDB has no Time to Live", "table", table)
	case err != nil:
		return fmt.Errorf("creating table %s: %w", table, err)
	}
	if err := createCustomersTable(tctx, client, customersTable); err != nil {
		return fmt.Errorf("creating table %s: %w", customersTable, err)
	}
	return nil
}

// addCustomers writes the customers of PAIDAPI_KEYS (keys) to the customers
// table, each unless present (so a plan changed by POST /admin/plan stays),
// within addTimeout. A bad entry is an error; a table that fails is logged,
// and the customers already in it are served.
func addCustomers(ctx context.Context, c *dynamoCustomers, keys string, logger *slog.Logger) error {
	m, err := plans.ParseKeys(keys)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, addTimeout)
	defer cancel()
	added := 0
	for key, cu := range m {
		ok, err := c.add(ctx, key, cu)
		if err != nil {
			logger.Error("adding PAIDAPI_KEYS's customers failed; serving those already in the table", "added", added, "error", err)
			return nil
		}
		if ok {
			added++
		}
	}
	logger.Info("PAIDAPI_KEYS's customers added unless present", "customers", len(m), "added", added)
	return nil
}

// config is what newAPI needs.
type config struct {
	client *dynamodb.Client
	// table is the limiter's table; customersTable the customers'.
	table, customersTable string
	// prefix separates this deployment's counters (tests use their own).
	prefix string
	tiers  plans.Tiers
	// timeout bounds each decision, refund, usage read and customer
	// lookup.
	timeout time.Duration
	// customerTTL is how long a customer is served from memory (zero
	// means defaultCustomerTTL).
	customerTTL time.Duration
	// adminToken, when not empty, enables POST /admin/plan for callers
	// that send it as a bearer token.
	adminToken string
	// quote is the downstream work a call pays for (nil: a made-up price).
	quote  func(ctx context.Context, symbol string) (float64, error)
	logger *slog.Logger
	// now is the clock of the decisions (nil: time.Now).
	now func() time.Time
}

// api is the paid API of package plans on DynamoDB.
type api struct {
	cfg       config
	limiter   *tokenbucket.Planned
	customers *dynamoCustomers
	*plans.API
}

// newAPI builds the store, the limiter, the Guard and the routes once, for
// every invocation the instance will serve.
func newAPI(cfg config) (*api, error) {
	store, err := dynamostore.New(cfg.client, dynamostore.Config{Table: cfg.table, MaxAttempts: maxAttempts, Now: cfg.now})
	if err != nil {
		return nil, fmt.Errorf("RATEKIT_TABLE: %w", err)
	}
	customers := newDynamoCustomers(cfg.client, cfg.customersTable, cfg.customerTTL)
	// One limiter for every plan: tokenbucket.Planned asks the customers
	// for the key's plan on each request and decides all its policies (the
	// burst and the monthly quota) in one conditional UpdateItem of the
	// key's item (Group), all or nothing, so a call the burst refuses
	// never touches the month, which is money.
	limiter, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{
		Prefix: cfg.prefix,
		Store:  store,
		Group:  true,
		Plan:   plans.PlanFunc(customers, cfg.tiers),
		Now:    cfg.now,
	})
	if err != nil {
		return nil, err
	}
	p, err := plans.New(plans.Config{
		Limiter: limiter, Customers: customers, Tiers: cfg.tiers, Store: "DynamoDB",
		Timeout: cfg.timeout, AdminToken: cfg.adminToken, Quote: cfg.quote, Logger: cfg.logger,
	})
	if err != nil {
		return nil, err
	}
	return &api{cfg: cfg, limiter: limiter, customers: customers, API: p}, nil
}

// newClient builds the DynamoDB client from the AWS SDK's configuration
// loading, which reads the region, the credentials and the endpoint
// variables (AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL) from the
// environment and shared files; getenv(EndpointEnv), when set, overrides
// the endpoint.
func newClient(ctx context.Context, getenv func(string) string) (*dynamodb.Client, error) {
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("loading the AWS SDK configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, errors.New("no AWS region: set AWS_REGION (any region, such as us-east-1, for DynamoDB Local or dynalite)")
	}
	var opts []func(*dynamodb.Options)
	if ep := getenv(EndpointEnv); ep != "" {
		opts = append(opts, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(ep) })
	}
	return dynamodb.NewFromConfig(cfg, opts...), nil
}
