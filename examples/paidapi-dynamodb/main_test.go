package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	awslambda "github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/examples/internal/plans"
	"github.com/ratekit/ratekit/examples/internal/plans/planstest"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
)

// The tables of the tests, created once per run (a test's customers and
// counters have keys and a prefix of their own).
const (
	testTable          = "ratekit_example_paidapi"
	testCustomersTable = "ratekit_example_paidapi_customers"
)

// testTimeout bounds each decision of the tests: dynalite on a loaded
// machine is no DynamoDB.
const testTimeout = 5 * time.Second

var (
	tablesOnce sync.Once
	tablesErr  error
)

// requests counts a client's item requests by table and sums the write
// units its UpdateItem and PutItem calls consumed.
type requests struct {
	mu         sync.Mutex
	ops        map[string]int // by table and operation
	writeUnits float64
}

// units returns the write units the UpdateItem and PutItem requests
// consumed.
func (r *requests) units() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writeUnits
}

// count returns the number of op requests on table.
func (r *requests) count(table, op string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ops[table+" "+op]
}

// middleware asks UpdateItem and PutItem for their consumed capacity and
// counts every request.
func (r *requests) middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("ratekit-example-count",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			var table string
			switch p := in.Parameters.(type) {
			case *dynamodb.UpdateItemInput:
				p.ReturnConsumedCapacity = types.ReturnConsumedCapacityTotal
				table = aws.ToString(p.TableName)
			case *dynamodb.GetItemInput:
				table = aws.ToString(p.TableName)
			case *dynamodb.PutItemInput:
				p.ReturnConsumedCapacity = types.ReturnConsumedCapacityTotal
				table = aws.ToString(p.TableName)
			case *dynamodb.DeleteItemInput:
				table = aws.ToString(p.TableName)
			case *dynamodb.ScanInput:
				table = aws.ToString(p.TableName)
			}
			out, md, err := next.HandleInitialize(ctx, in)
			r.mu.Lock()
			defer r.mu.Unlock()
			r.ops[table+" "+awsmiddleware.GetOperationName(ctx)]++
			var c *types.ConsumedCapacity
			switch o := out.Result.(type) {
			case *dynamodb.UpdateItemOutput:
				c = o.ConsumedCapacity
			case *dynamodb.PutItemOutput:
				c = o.ConsumedCapacity
			}
			if c != nil && c.CapacityUnits != nil {
				r.writeUnits += *c.CapacityUnits
			}
			return out, md, err
		}), middleware.After)
}

// testClient returns a client of DynamoDB at endpoint (keepAlive false:
// dynalite closes idle connections under requests, see dynamostore's
// tests) and the count of its requests.
func testClient(t testing.TB, endpoint string, keepAlive bool) (*dynamodb.Client, *requests) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = !keepAlive
	t.Cleanup(tr.CloseIdleConnections)
	reqs := &requests{ops: map[string]int{}}
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		HTTPClient:   &http.Client{Transport: tr},
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		}),
		APIOptions: []func(*middleware.Stack) error{reqs.middleware},
	}), reqs
}

// testAPI returns an API on client for s, counting under a prefix of its
// own, after adding s.Keys's customers; change, when not nil, changes its
// config first.
func testAPI(t testing.TB, client *dynamodb.Client, s planstest.Setup, change func(*config)) *api {
	t.Helper()
	tablesOnce.Do(func() {
		c, _ := testClient(t, testenv.DynamoDBEndpoint(t), false)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		err := createTables(ctx, c, testTable, testCustomersTable, slog.New(slog.DiscardHandler))
		if errors.Is(err, dynamostore.ErrNoTTL) && os.Getenv(testenv.DynamoDBEnv) == "" {
			err = nil // dynalite has no Time to Live
		}
		tablesErr = err
	})
	if tablesErr != nil {
		t.Fatal(tablesErr)
	}
	cfg := config{
		client: client, table: testTable, customersTable: testCustomersTable, prefix: planstest.Unique("test"),
		tiers: s.Tiers, timeout: testTimeout, adminToken: s.AdminToken, quote: s.Quote, logger: slog.New(slog.DiscardHandler),
	}
	if change != nil {
		change(&cfg)
	}
	a, err := newAPI(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := plans.ParseKeys(s.Keys)
	if err != nil {
		t.Fatal(err)
	}
	for key, cu := range m {
		if _, err := a.customers.add(context.Background(), key, cu); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

// The checks every paid API passes (planstest.Run), on DynamoDB; the
// requests they make are among those template.yaml's IAM policy allows on
// each table.
func TestPaidAPI(t *testing.T) {
	client, reqs := testClient(t, testenv.DynamoDBEndpoint(t), false)
	planstest.Run(t, func(t *testing.T, s planstest.Setup) awslambda.Handler {
		return awslambda.NewHandler(testAPI(t, client, s, nil).Route)
	})
	allowed := allowedActions(t)
	reqs.mu.Lock()
	defer reqs.mu.Unlock()
	for op, n := range reqs.ops {
		if table, action, _ := strings.Cut(op, " "); !allowed[table]["dynamodb:"+action] {
			t.Errorf("%d %s requests on %s: template.yaml does not allow them", n, action, table)
		}
	}
}

// allowedActions reads template.yaml's IAM statements: the actions allowed
// on the limiter's table and the customers table, by the tests' names.
func allowedActions(t *testing.T) map[string]map[string]bool {
	tmpl, err := os.ReadFile("template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tables := map[string]string{"RateLimitTable": testTable, "CustomersTable": testCustomersTable}
	allowed := map[string]map[string]bool{}
	var actions []string
	for _, line := range strings.Split(string(tmpl), "\n") {
		line = strings.TrimSpace(line)
		if a, ok := strings.CutPrefix(line, "- dynamodb:"); ok {
			actions = append(actions, "dynamodb:"+a)
		}
		if r, ok := strings.CutPrefix(line, "Resource: !GetAtt "); ok {
			table := tables[strings.TrimSuffix(r, ".Arn")]
			if table == "" || allowed[table] != nil {
				t.Fatalf("template.yaml: a statement on %s", r)
			}
			allowed[table] = map[string]bool{}
			for _, a := range actions {
				allowed[table][a] = true
			}
			actions = nil
		}
	}
	if len(allowed) != 2 {
		t.Fatalf("template.yaml: statements on %d tables, want 2", len(allowed))
	}
	return allowed
}

// A decision is one UpdateItem of the limiter's table, whatever the plan;
// the customer is read once per customer TTL in an instance; a plan
// changed through another instance reaches this one when its copy
// expires. The test logs the write units a decision consumed.
func TestDecisionCostAndCustomerCache(t *testing.T) {
	endpoint := testenv.DynamoDBEndpoint(t)
	customer := planstest.Unique("customer")
	s := planstest.Default(customer)
	s.Tiers.Free.Quota, s.Tiers.Pro.Quota = 10, 100
	client, reqs := testClient(t, endpoint, false)
	var clock time.Time
	a := testAPI(t, client, s, nil)
	a.customers.now = func() time.Time { return clock }
	clock = time.Now()
	h := awslambda.NewHandler(a.Route)
	other := awslambda.NewHandler(testAPI(t, client, s, func(c *config) { c.prefix = a.cfg.prefix }).Route)

	// The customer's first call reads the customer; its item in the
	// limiter's table may take more than one request to create.
	if n := planstest.Admitted(t, h, customer, 1); n != 1 {
		t.Fatal("the first call was not admitted")
	}
	if g := reqs.count(testCustomersTable, "GetItem"); g != 1 {
		t.Fatalf("the first call read the customer %d times", g)
	}
	gets, updates, units := reqs.count(testTable, "GetItem"), reqs.count(testTable, "UpdateItem"), reqs.units()
	if n := planstest.Admitted(t, h, customer, 4); n != 4 {
		t.Fatalf("%d of 4 admitted", n)
	}
	g, u, cg := reqs.count(testTable, "GetItem")-gets, reqs.count(testTable, "UpdateItem")-updates, reqs.count(testCustomersTable, "GetItem")
	if g != 0 || u != 4 || cg != 1 {
		t.Fatalf("4 decisions made %d GetItem and %d UpdateItem requests of the limiter's table and read the customer %d times in all; want 0, 4 and 1", g, u, cg)
	}
	t.Logf("write units per decision (ConsumedCapacity): %.2f", (reqs.units()-units)/4)

	// Another instance moves the customer to pro (5 left of 10 becomes 95
	// of 100): this one serves its copy until it expires.
	planstest.SetPlan(t, other, customer, "pro", 0)
	if u := planstest.UsageOf(t, h, customer); u.Plan != "free" || u.Policies[1].Quota != 10 {
		t.Fatalf("within the customer TTL: %+v, want the free plan still", u)
	}
	clock = clock.Add(defaultCustomerTTL)
	if u := planstest.UsageOf(t, h, customer); u.Plan != "pro" || u.Policies[1].Quota != 100 || u.Policies[1].Used != 5 {
		t.Fatalf("after the customer TTL: %+v, want pro with 5 used", u)
	}
}

// -bill prints each key's billing months that start in the span, with what
// the key used: the current month as it stands.
func TestBill(t *testing.T) {
	endpoint := testenv.DynamoDBEndpoint(t)
	customer := planstest.Unique("customer")
	client, _ := testClient(t, endpoint, false)
	a := testAPI(t, client, planstest.Default(customer), nil)
	if n := planstest.Admitted(t, awslambda.NewHandler(a.Route), customer, 4); n != 3 {
		t.Fatalf("%d of 4 admitted, want 3", n)
	}
	for _, kv := range [][2]string{{"AWS_REGION", "us-east-1"}, {"AWS_ACCESS_KEY_ID", "test"}, {"AWS_SECRET_ACCESS_KEY", "test"}} {
		t.Setenv(kv[0], kv[1])
	}
	env := map[string]string{"RATEKIT_TABLE": testTable, EndpointEnv: endpoint} // -bill reads no customer
	start, end := ratekit.Period{Unit: ratekit.Month, Location: time.UTC}.Bounds(time.Now())
	var stdout, stderr bytes.Buffer
	span := start.Format(time.RFC3339) + "/" + start.Add(time.Second).Format(time.RFC3339)
	if err := run(context.Background(), []string{"-bill", span, "-prefix", a.cfg.prefix}, func(k string) string { return env[k] }, &stdout, &stderr, nil); err != nil {
		t.Fatalf("-bill: %v\n%s", err, stderr.String())
	}
	key, _ := httplimit.APIKey(customer)
	want := billingLine{Key: key, PeriodStart: start.UTC(), PeriodEnd: end.UTC(), Used: 3}
	var got billingLine
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || got != want || strings.Count(stdout.String(), "\n") != 1 {
		t.Fatalf("-bill printed %q (%v), want one line %+v", stdout.String(), err, want)
	}
}

// A downgrade leaves nothing until the month ends, and the month's end
// gives the customer the new plan's quota afresh; the ended month's count
// is kept for billing beside the new one's.
func TestMonthEnd(t *testing.T) {
	endpoint := testenv.DynamoDBEndpoint(t)
	customer := planstest.Unique("customer")
	client, _ := testClient(t, endpoint, false)
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return clock
	}
	a := testAPI(t, client, planstest.Default(customer), func(c *config) { c.now = now })
	h := awslambda.NewHandler(a.Route)
	monthly := func() plans.PolicyUsage { return planstest.UsageOf(t, h, customer).Policies[1] }

	planstest.SetPlan(t, h, customer, plans.Pro, 0) // 5 a month
	if n := planstest.Admitted(t, h, customer, 6); n != 5 {
		t.Fatalf("pro plan: %d of 6 admitted, want 5", n)
	}
	planstest.SetPlan(t, h, customer, plans.Free, 0) // 3 a month
	if m := monthly(); m.Used != 5 || m.Remaining != 0 {
		t.Fatalf("after the downgrade: %+v, want 5 used and 0 left", m)
	}
	start, end := ratekit.Period{Unit: ratekit.Month, Location: time.UTC}.Bounds(clock)
	mu.Lock()
	clock = end.Add(time.Second)
	mu.Unlock()
	if m := monthly(); m.Used != 0 || m.Remaining != 3 {
		t.Fatalf("in the next month: %+v, want 0 used and 3 left of the free plan", m)
	}
	if n := planstest.Admitted(t, h, customer, 1); n != 1 {
		t.Fatal("the next month's first call was refused")
	}
	var out bytes.Buffer
	if err := billing(context.Background(), client, testTable, a.cfg.prefix, start, end.Add(time.Second), &out); err != nil {
		t.Fatal(err)
	}
	key, _ := httplimit.APIKey(customer)
	_, next := ratekit.Period{Unit: ratekit.Month, Location: time.UTC}.Bounds(end)
	want := []billingLine{{key, start.UTC(), end.UTC(), 5}, {key, end.UTC(), next.UTC(), 1}}
	// In the store's order (a Scan's).
	var got []billingLine
	for dec := json.NewDecoder(&out); dec.More(); {
		var l billingLine
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
		got = append(got, l)
	}
	slices.SortFunc(got, func(a, b billingLine) int { return a.PeriodStart.Compare(b.PeriodStart) })
	if !slices.Equal(got, want) {
		t.Fatalf("billing lines %+v, want %+v", got, want)
	}
}
