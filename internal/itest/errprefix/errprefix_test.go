package errprefix_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/breaker"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/redisengine"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/lambda"
	"github.com/ratekit/ratekit/otelratekit"
	"github.com/ratekit/ratekit/signedwindow"
	"github.com/ratekit/ratekit/tokenbucket"
)

// packages are the names an error may start with.
var packages = []string{"ratekit", "signedwindow", "tokenbucket", "durable", "pgstore", "memstore", "redisstore",
	"rueidisstore", "dynamostore", "httplimit", "lambda", "breaker", "otelratekit", "kvstore", "pglock"}

// checkPrefix holds an error to the rule: it starts with the name of the
// package that was called and its class, "<package>: invalid config: ",
// and names no other package before the class.
func checkPrefix(t *testing.T, pkg, class string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", pkg)
		return
	}
	msg := err.Error()
	if want := pkg + ": " + class + ": "; !strings.HasPrefix(msg, want) {
		t.Errorf("%s: %q does not start with %q", pkg, msg, want)
	}
	for _, other := range packages {
		if other != pkg && regexp.MustCompile(`\b`+other+`: `).MatchString(msg) {
			t.Errorf("%s: %q names package %s too", pkg, msg, other)
		}
	}
	if strings.Count(msg, class) != 1 {
		t.Errorf("%s: %q says %q %d times", pkg, msg, class, strings.Count(msg, class))
	}
}

// entry is how the table of TestConfigErrorPrefix checks one discovered
// function: calls with invalid input, each of whose errors must match want
// (ratekit.ErrInvalidConfig when nil) and read "<package>: <class>: "
// (class "invalid config" when empty); or valid, a call with zero values
// that must succeed; or reason, why the function takes no configuration.
type entry struct {
	calls  []func() error
	want   error
	class  string
	valid  func() error
	reason string
}

// TestConfigErrorPrefix holds every exported constructor and validator of
// the library packages to the rule. It discovers them itself (see
// discover), so a new one fails this test, naming it, until the table
// below has an invalid call for it.
func TestConfigErrorPrefix(t *testing.T) {
	store, pg := stores(t)
	keys := []signedwindow.Key{{ID: 1, Secret: []byte(strings.Repeat("k", signedwindow.MinSecretLen))}}
	e := func(_ any, err error) error { return err }
	plan := func(context.Context, string) (ratekit.Plan, error) { return ratekit.Plan{}, nil }
	const request = "checks a request, not a configuration: its errors are ratekit.ErrInvalidRequest's, held by TestRequestErrors"
	table := map[string]entry{
		"ratekit.All": {calls: []func() error{
			func() error { return e(ratekit.All()) },
			func() error { return e(ratekit.All(nil)) },
		}},
		"ratekit.ValidatePolicyName": {calls: []func() error{
			func() error { return ratekit.ValidatePolicyName("") },
			func() error { return ratekit.ValidatePolicyName("a b") },
		}},
		"ratekit.Plan.Validate": {calls: []func() error{
			func() error { return ratekit.Plan{Name: "p"}.Validate() },
			func() error {
				return ratekit.Plan{Name: "p", Policies: []ratekit.Policy{{Name: "a b", Quota: 1, Window: time.Second}}}.Validate()
			},
			func() error {
				return ratekit.Plan{Name: "p", Policies: []ratekit.Policy{{Name: "a", Quota: 1, Period: ratekit.Period{Unit: 9}}}}.Validate()
			},
		}},
		"ratekit.Period.Validate": {calls: []func() error{
			func() error { return ratekit.Period{}.Validate() },
		}},
		"ratekit.Policy.ValidatePeriod": {calls: []func() error{
			func() error { return ratekit.Policy{Name: "p"}.ValidatePeriod() },
			func() error { return ratekit.Policy{Name: "p", Period: ratekit.Period{Unit: 9}}.ValidatePeriod() },
		}},
		"ratekit.Request.Validate": {reason: request},
		"ratekit.ValidateKey":      {reason: request},
		"kvstore.Refill.Validate": {want: kvstore.ErrInvalidRefill, class: "invalid refill", calls: []func() error{
			func() error { return kvstore.Refill{}.Validate() },
		}},
		"kvstore.PeriodBounds.Validate": {want: kvstore.ErrInvalidPeriod, class: "invalid period", calls: []func() error{
			func() error { return kvstore.PeriodBounds{}.Validate() },
		}},
		"kvstore.CheckMulti": {want: kvstore.ErrInvalidOp, class: "invalid operation", calls: []func() error{
			func() error { return kvstore.CheckMulti(kvstore.OpTake, nil, nil) },
		}},
		"kvstore.CheckMultiPeriods": {want: kvstore.ErrInvalidOp, class: "invalid operation", calls: []func() error{
			func() error { return e(kvstore.CheckMultiPeriods(kvstore.OpTake, nil, nil)) },
		}},
		"signedwindow.New": {calls: []func() error{
			func() error { return e(signedwindow.New(signedwindow.Config{})) },
			func() error { return e(signedwindow.New(signedwindow.Config{Name: "p", Quota: 0})) },
		}},
		"signedwindow.NewComposite": {calls: []func() error{
			func() error { return e(signedwindow.NewComposite(signedwindow.CompositeConfig{})) },
			func() error {
				return e(signedwindow.NewComposite(signedwindow.CompositeConfig{Keys: keys, Policies: []ratekit.Policy{{Name: "a b", Quota: 1, Window: time.Minute}}}))
			},
		}},
		"signedwindow.ParseToken": {reason: "parses a client's token, not a configuration: its errors are signedwindow.ErrToken*"},
		"signedwindow.Solve":      {reason: "solves a client's challenge, not a configuration: its errors are signedwindow.ErrTokenMalformed and ctx's"},
		"tokenbucket.New": {calls: []func() error{
			func() error { return e(tokenbucket.New(tokenbucket.Config{})) },
			func() error { return e(tokenbucket.New(tokenbucket.Config{Name: "p", Store: store})) },
		}},
		"tokenbucket.NewComposite": {calls: []func() error{
			func() error { return e(tokenbucket.NewComposite(tokenbucket.CompositeConfig{})) },
			func() error {
				return e(tokenbucket.NewComposite(tokenbucket.CompositeConfig{Mode: tokenbucket.Atomic, Store: store, Buckets: []tokenbucket.Bucket{{Name: "x"}}}))
			},
		}},
		"tokenbucket.NewPlanned": {calls: []func() error{
			func() error { return e(tokenbucket.NewPlanned(tokenbucket.PlannedConfig{})) },
			func() error { return e(tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "p", Store: store})) },
			func() error {
				return e(tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "a b", Store: store, Plan: plan}))
			},
		}},
		"durable.New": {calls: []func() error{
			func() error { return e(durable.New(durable.Config{Durability: durable.Unlogged})) },
			func() error {
				return e(durable.New(durable.Config{Store: pg, Policy: ratekit.Policy{Name: "p", Quota: 1, Algorithm: ratekit.FixedWindow}, Durability: durable.Unlogged}))
			},
			func() error {
				return e(durable.New(durable.Config{Store: pg, Policy: ratekit.Policy{Name: "p", Quota: 1, Window: time.Hour}, Durability: durable.Unlogged}))
			},
			func() error {
				return e(durable.New(durable.Config{Store: pg, Policy: ratekit.Policy{Name: "a b", Quota: 1, Window: time.Hour}, Durability: durable.Unlogged}))
			},
		}},
		"durable.NewComposite": {calls: []func() error{
			func() error { return e(durable.NewComposite(nil)) },
			func() error { return e(durable.NewComposite()) },
		}},
		"durable.NewPlanned": {calls: []func() error{
			func() error { return e(durable.NewPlanned(durable.PlannedConfig{})) },
			func() error {
				return e(durable.NewPlanned(durable.PlannedConfig{Store: pg, Plan: plan, Durability: durable.Logged}))
			},
		}},
		"pgstore.New": {calls: []func() error{
			func() error { return e(pgstore.New(nil, pgstore.Config{})) },
			func() error { return e(pgstore.New(&fakeDB{}, pgstore.Config{Schema: "A B"})) },
		}},
		"pgstore.SchemaSQL": {calls: []func() error{
			func() error { return e(pgstore.SchemaSQL("A B")) },
		}},
		"pgstore.ValidateSchemaName": {calls: []func() error{
			func() error { return pgstore.ValidateSchemaName("") },
		}},
		"pglock.Lock":      {reason: "takes database locks: its errors are the database's and pglock.ErrLockNotAcquired"},
		"pglock.TryLock":   {reason: "takes database locks: its errors are the database's and pglock.ErrLockNotAcquired"},
		"pglock.LockTx":    {reason: "takes database locks: its errors are the database's and pglock.ErrLockNotAcquired"},
		"pglock.TryLockTx": {reason: "takes database locks: its errors are the database's and pglock.ErrLockNotAcquired"},
		"memstore.New": {calls: []func() error{
			func() error { return e(memstore.New(memstore.Config{MaxKeys: -1})) },
		}},
		"redisstore.New": {calls: []func() error{
			func() error { return e(redisstore.New(nil, redisstore.Config{})) },
		}},
		"redisengine.New": {calls: []func() error{
			func() error { return e(redisengine.New(nil, redisengine.Config{})) },
			func() error { return e(redisengine.New(nil, redisengine.Config{Name: "redisengine", Protocol: -1})) },
		}},
		"rueidisstore.New": {calls: []func() error{
			func() error { return e(rueidisstore.New(nil, rueidisstore.Config{})) },
		}},
		"dynamostore.New": {calls: []func() error{
			func() error { return e(dynamostore.New(nil, dynamostore.Config{})) },
		}},
		"dynamostore.CreateTable": {reason: "creates a table through a client the caller built: its errors are DynamoDB's"},
		"breaker.New": {calls: []func() error{
			func() error { return e(breaker.New(nil, breaker.Config{})) },
		}},
		"lambda.New": {calls: []func() error{
			func() error { return e(lambda.New(lambda.Config{})) },
		}},
		"lambda.ForwardedForKey": {calls: []func() error{
			func() error { return e(lambda.ForwardedForKey(0)) },
		}},
		"lambda.APIKeyHeaderKey": {calls: []func() error{
			func() error { return e(lambda.APIKeyHeaderKey("")) },
		}},
		"lambda.ClaimKey": {calls: []func() error{
			func() error { return e(lambda.ClaimKey("")) },
		}},
		"lambda.EventHeader": {calls: []func() error{
			func() error { return e(lambda.EventHeader(42)) },
		}},
		"lambda.NewEMFObserver": {calls: []func() error{
			func() error { return e(lambda.NewEMFObserver(lambda.EMFConfig{Namespace: "AWS/x"})) },
		}},
		"httplimit.NewGuard": {calls: []func() error{
			func() error { return e(httplimit.NewGuard(httplimit.GuardConfig{})) },
		}},
		"httplimit.Middleware": {calls: []func() error{
			func() error { return e(httplimit.Middleware(httplimit.MiddlewareConfig{})) },
		}},
		"httplimit.ForwardedForKey": {calls: []func() error{
			func() error { return e(httplimit.ForwardedForKey(-1)) },
		}},
		"httplimit.ForwardedForClient": {calls: []func() error{
			func() error { return e(httplimit.ForwardedForClient(nil, 0)) },
		}},
		"httplimit.HeaderIPKey": {calls: []func() error{
			func() error { return e(httplimit.HeaderIPKey("a b")) },
		}},
		"httplimit.APIKeyHeaderKey": {calls: []func() error{
			func() error { return e(httplimit.APIKeyHeaderKey("a b")) },
		}},
		"httplimit.ParseIPKey": {want: httplimit.ErrNoKey, class: "no usable rate-limit key", calls: []func() error{
			func() error { return e(httplimit.ParseIPKey("x")) },
		}},
		"httplimit.APIKey": {want: httplimit.ErrNoKey, class: "no usable rate-limit key", calls: []func() error{
			func() error { return e(httplimit.APIKey("")) },
		}},
		"httplimit.NewContext":    {reason: "stores a decision in a context; it returns no error"},
		"otelratekit.NewObserver": {valid: func() error { return e(otelratekit.NewObserver(otelratekit.Config{})) }},
	}
	found := discover(t)
	for _, name := range found {
		if _, ok := table[name]; !ok {
			t.Errorf("%s: discovered, but the table of TestConfigErrorPrefix has no entry for it; add calls with invalid input (or a reason it takes no configuration)", name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(table)) {
		tc := table[name]
		if !slices.Contains(found, name) {
			t.Errorf("%s: in the table but not discovered; remove its entry", name)
			continue
		}
		pkg, _, _ := strings.Cut(name, ".")
		switch {
		case tc.reason != "":
			continue
		case tc.valid != nil:
			if err := tc.valid(); err != nil {
				t.Errorf("%s with zero values: %v, want no error", name, err)
			}
			continue
		case len(tc.calls) == 0:
			t.Errorf("%s: no calls, no valid call and no reason", name)
		}
		want, class := tc.want, tc.class
		if want == nil {
			want, class = ratekit.ErrInvalidConfig, "invalid config"
		}
		for i, call := range tc.calls {
			err := call()
			if !errors.Is(err, want) {
				t.Errorf("%s call %d: %v, want an error matching %v", name, i, err, want)
				continue
			}
			checkPrefix(t, pkg, class, err)
		}
	}
}

// TestStoreInputErrors: kvstore's checks of a store call name the class
// first and the update after it, as every other error does.
func TestStoreInputErrors(t *testing.T) {
	period := []kvstore.Update{{Key: "k", Period: &kvstore.PeriodBounds{}, N: 1}}
	res := make([]kvstore.OpResult, 1)
	checkPrefix(t, "kvstore", "invalid period", kvstore.CheckMulti(kvstore.OpTake, period, res))
	_, err := kvstore.CheckMultiPeriods(kvstore.OpTake, period, res)
	checkPrefix(t, "kvstore", "invalid period", err)
	bucket := []kvstore.Update{{Key: "k", Refill: kvstore.Refill{Burst: 1, Rate: 1}, N: 2}}
	checkPrefix(t, "kvstore", "invalid operation", kvstore.CheckMulti(kvstore.OpTake, bucket, res))
	bucket[0].Refill = kvstore.Refill{}
	checkPrefix(t, "kvstore", "invalid refill", kvstore.CheckMulti(kvstore.OpTake, bucket, res))
}

// TestDecisionConfigErrors: a configuration met at decision time, a plan
// that a Plan func returns, is refused as a constructor's would be, in the
// words of the package called, by both planned limiters and by
// ratekit.All.
func TestDecisionConfigErrors(t *testing.T) {
	ctx := context.Background()
	store, pg := stores(t)
	plans := []ratekit.Plan{
		{Name: "empty"},
		{Name: "bad-name", Policies: []ratekit.Policy{{Name: "a b", Quota: 1, Window: time.Second, Algorithm: ratekit.FixedWindow}}},
		{Name: "twice", Policies: []ratekit.Policy{
			{Name: "a", Quota: 1, Window: time.Second, Algorithm: ratekit.FixedWindow},
			{Name: "a", Quota: 1, Window: time.Second, Algorithm: ratekit.FixedWindow},
		}},
		{Name: "bad-period", Policies: []ratekit.Policy{{Name: "a", Quota: 1, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: 9}}}},
	}
	// Plans that ratekit.Plan.Validate accepts and the strategy refuses.
	tbPlans := append(slices.Clip(plans), ratekit.Plan{Name: "log", Policies: []ratekit.Policy{{Name: "a", Quota: 1, Window: time.Second, Algorithm: ratekit.SlidingLog}}})
	durablePlans := append(slices.Clip(plans),
		ratekit.Plan{Name: "long", Policies: []ratekit.Policy{{Name: strings.Repeat("a", ratekit.MaxPolicyNameLen-1), Quota: 1, Window: time.Second, Algorithm: ratekit.FixedWindow}}},
		ratekit.Plan{Name: "slow", Policies: []ratekit.Policy{{Name: "a", Quota: 600, Window: time.Millisecond, Algorithm: ratekit.TokenBucket}}},
	)
	type plannedLimiter interface {
		ratekit.Limiter
		ratekit.Resetter
	}
	for _, tc := range []struct {
		pkg   string
		plans []ratekit.Plan
		new   func(func(context.Context, string) (ratekit.Plan, error)) (plannedLimiter, error)
	}{
		{"tokenbucket", tbPlans, func(plan func(context.Context, string) (ratekit.Plan, error)) (plannedLimiter, error) {
			return tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "p", Store: store, Plan: plan})
		}},
		{"durable", durablePlans, func(plan func(context.Context, string) (ratekit.Plan, error)) (plannedLimiter, error) {
			return durable.NewPlanned(durable.PlannedConfig{Prefix: "p", Store: pg, Durability: durable.Unlogged, Plan: plan})
		}},
	} {
		for _, plan := range tc.plans {
			l, err := tc.new(func(context.Context, string) (ratekit.Plan, error) { return plan, nil })
			if err != nil {
				t.Fatal(err)
			}
			_, err = l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
			decisionErr(t, tc.pkg, plan.Name+": Allow", err)
			decisionErr(t, tc.pkg, plan.Name+": Reset", l.Reset(ctx, "k"))
		}
	}
	// Usage reports name a policy: of a limiter without a period, or one
	// that no plan could hold.
	planned, err := durable.NewPlanned(durable.PlannedConfig{Prefix: "p", Store: pg, Durability: durable.Unlogged,
		Plan: func(context.Context, string) (ratekit.Plan, error) { return ratekit.Plan{}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	none := func(durable.PeriodUsage) error { return nil }
	for _, name := range []string{"a b", strings.Repeat("a", ratekit.MaxPolicyNameLen)} {
		decisionErr(t, "durable", "PeriodUsage of "+name, planned.PeriodUsage(ctx, name, time.Time{}, time.Now(), none))
	}
	tbPlanned, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "p", Store: store,
		Plan: func(context.Context, string) (ratekit.Plan, error) { return ratekit.Plan{}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a b", "a/p", strings.Repeat("a", ratekit.MaxPolicyNameLen+1)} {
		decisionErr(t, "tokenbucket", "PeriodUsage of "+name, tbPlanned.PeriodUsage(ctx, name, time.Time{}, time.Now(), func(ratekit.PeriodUsage) error { return nil }))
	}
	windowed, err := durable.New(durable.Config{Store: pg, Durability: durable.Unlogged,
		Policy: ratekit.Policy{Name: "w", Quota: 1, Window: time.Second, Algorithm: ratekit.FixedWindow}})
	if err != nil {
		t.Fatal(err)
	}
	decisionErr(t, "durable", "PeriodUsage without a period", windowed.PeriodUsage(ctx, time.Time{}, time.Now(), none))
	// Two limiters that each return client state: one token cannot carry
	// both, which ratekit.All finds only when they answer.
	keys := []signedwindow.Key{{ID: 1, Secret: []byte(strings.Repeat("k", signedwindow.MinSecretLen))}}
	var sw [2]ratekit.Limiter
	for i := range sw {
		if sw[i], err = signedwindow.New(signedwindow.Config{Name: fmt.Sprint("p", i), Quota: 2, Window: time.Minute, Keys: keys}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := ratekit.All(sw[0], sw[1])
	if err != nil {
		t.Fatal(err)
	}
	_, err = all.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
	decisionErr(t, "ratekit", "All of two signed windows: Allow", err)
}

// decisionErr holds a decision's error to the rule of configuration errors.
func decisionErr(t *testing.T, pkg, what string, err error) {
	t.Helper()
	if !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Errorf("%s: %s: %v, want an ErrInvalidConfig", pkg, what, err)
		return
	}
	checkPrefix(t, pkg, "invalid config", err)
}

// TestConfigErrorsThroughHelper holds the rule by construction: in every
// library package (those discover reads), ErrInvalidConfig is named only
// by the package's configErr, the one function that writes "<package>:
// invalid config: ", and by errors.Is. Another function that wraps it
// would write the prefix by hand.
func TestConfigErrorsThroughHelper(t *testing.T) {
	// inline are the packages whose constructors build their few config
	// errors inline; TestConfigErrorPrefix still holds their text.
	inline := map[string]bool{"redisstore": true, "rueidisstore": true}
	walkLibrary(t, func(path string, fset *token.FileSet, f *ast.File) {
		if inline[f.Name.Name] {
			return
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil || fd.Name.Name == "configErr" || fd.Name.Name == "Unwrap" {
				continue
			}
			allowed := map[ast.Node]bool{}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if call, ok := n.(*ast.CallExpr); ok && types.ExprString(call.Fun) == "errors.Is" && len(call.Args) == 2 {
					allowed[call.Args[1]] = true
				}
				var name string
				switch x := n.(type) {
				case *ast.SelectorExpr:
					name = x.Sel.Name
				case *ast.Ident:
					name = x.Name
				}
				if name != "ErrInvalidConfig" {
					return true
				}
				if !allowed[n] {
					t.Errorf("%s: %s names ErrInvalidConfig; make the error with the package's configErr", fset.Position(n.Pos()), fd.Name.Name)
				}
				return false // a selector's Sel is the same name
			})
		}
	})
}

// walkLibrary calls fn with every non-test file of the library packages:
// those under libraryRoot outside internal, cmd, testdata, examples and
// benchmarks directories, except the conformance suites (packages named
// *test), whose errors are the limiter's under test.
func walkLibrary(t *testing.T, fn func(path string, fset *token.FileSet, f *ast.File)) {
	t.Helper()
	skip := map[string]bool{"internal": true, "cmd": true, "testdata": true, "examples": true, "benchmarks": true}
	err := filepath.WalkDir(libraryRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != libraryRoot && (skip[d.Name()] || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if !strings.HasSuffix(f.Name.Name, "test") {
			fn(path, fset, f)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// libraryRoot is the repository's root, which holds the root module and
// the library modules nested in it.
const libraryRoot = "../../.."

// discover returns, sorted, "package.Func" for every exported function of
// the library packages whose name starts with New or whose last result is
// an error, and "package.Type.Method" for every exported method whose name
// starts with Validate, in the library packages (see walkLibrary). It
// reads the files with go/parser, so it needs no build and misses nothing
// that compiles.
func discover(t *testing.T) []string {
	t.Helper()
	var found []string
	walkLibrary(t, func(_ string, _ *token.FileSet, f *ast.File) {
		pkg := f.Name.Name
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || !fd.Name.IsExported() {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil {
				recv := fd.Recv.List[0].Type
				if star, ok := recv.(*ast.StarExpr); ok {
					recv = star.X
				}
				if id, ok := recv.(*ast.Ident); ok && id.IsExported() && strings.HasPrefix(name, "Validate") {
					found = append(found, pkg+"."+id.Name+"."+name)
				}
				continue
			}
			res := fd.Type.Results
			returnsErr := res != nil && len(res.List) > 0 && types.ExprString(res.List[len(res.List)-1].Type) == "error"
			if strings.HasPrefix(name, "New") || returnsErr {
				found = append(found, pkg+"."+name)
			}
		}
	})
	if len(found) < 40 {
		t.Fatalf("discovered %d functions under %s, fewer than the 40 there are: %v", len(found), libraryRoot, found)
	}
	slices.Sort(found)
	return slices.Compact(found)
}

// TestRequestErrors: an invalid request is refused with the sentinel error
// of ratekit that says what is wrong, by every strategy alike.
func TestRequestErrors(t *testing.T) {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	keys := []signedwindow.Key{{ID: 1, Secret: []byte(strings.Repeat("k", signedwindow.MinSecretLen))}}
	sw, err := signedwindow.New(signedwindow.Config{Name: "p", Quota: 2, Window: time.Minute, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	tb, err := tokenbucket.New(tokenbucket.Config{Name: "p", Burst: 2, RefillRate: tokenbucket.PerSecond(1), Mode: tokenbucket.Atomic, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	all, err := ratekit.All(sw, tb)
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]ratekit.Limiter{"signedwindow": sw, "tokenbucket": tb, "All": all} {
		for _, tc := range []struct {
			req  ratekit.Request
			want error
		}{
			{ratekit.Request{Key: "", Cost: 1}, ratekit.ErrEmptyKey},
			{ratekit.Request{Key: strings.Repeat("k", ratekit.MaxKeyLen+1), Cost: 1}, ratekit.ErrKeyTooLong},
			{ratekit.Request{Key: "k", Cost: 0}, ratekit.ErrInvalidCost},
			{ratekit.Request{Key: "k", Cost: 3}, ratekit.ErrCostExceedsQuota},
		} {
			_, err := l.Allow(context.Background(), tc.req)
			if !errors.Is(err, tc.want) || !errors.Is(err, ratekit.ErrInvalidRequest) {
				t.Errorf("%s: Allow(%+v) = %v, want %v", name, tc.req, err, tc.want)
				continue
			}
			if msg := err.Error(); !strings.Contains(msg, "invalid request: ") || strings.Count(msg, "invalid request") != 1 {
				t.Errorf("%s: %q, want one \"invalid request: \"", name, msg)
			}
		}
	}
}

// stores returns a memstore and a pgstore over a database that is never
// called: constructors and plan checks contact no store.
func stores(t *testing.T) (*memstore.Store, *pgstore.Store) {
	t.Helper()
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := pgstore.New(&fakeDB{}, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return store, pg
}

// fakeDB satisfies pgstore.DB for constructors, which never call it.
type fakeDB struct{}

func (fakeDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errors.New("not called")
}

func (fakeDB) QueryRow(context.Context, string, ...any) pgx.Row { return nil }
