// Package skew_test is the release check's skew test: a user's module
// graph can pair a store module with an older or newer root module, and no
// such pair may decide silently wrong.
package skew_test

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"

	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/itest/modproxy"
	"github.com/ratekit/ratekit/internal/testenv"
)

const root = modproxy.Root

// repo is the repository's root, from this package's directory.
const repo = "../../.."

// The two sides of the skew test. Minimal version selection gives a user
// who upgrades one module a newer root under an older store (or, with a
// replace, the reverse), so every store module is paired with the root at
// the other side's version.
const (
	// skewBaseEnv names the commit served as every module's v0.1.0; empty
	// means defaultSkewBase.
	skewBaseEnv     = "RATEKIT_SKEW_BASE"
	defaultSkewBase = "4973956"
	// skewHeadEnv names the commit served as every module's v0.2.0; empty
	// means the working tree.
	skewHeadEnv = "RATEKIT_SKEW_HEAD"

	oldVersion = "v0.1.0"
	newVersion = "v0.2.0"
)

// skewProgram is the program each pair runs: it builds a limiter of 10,000
// tokens refilled at 1,000 per second on the store, then decides a fixed
// sequence whose outcome does not depend on timing within wide margins:
// the full bucket is taken (admitted); 5,000 more right away (refused: they
// take 5 s to refill); after 200 ms, 190 (admitted: about 200 are back);
// then 1,000 (refused: about 10 are left, 1,000 take a second). A store
// and an engine that disagree on a unit (the rate per µs against per ms,
// the bucket 0.2 tokens fuller after 200 ms instead of 200) turn one of
// them around. The program prints "decisions: [...]"; when building the
// store or the limiter fails it prints "construct: invalidconfig=<whether
// the error matches ratekit.ErrInvalidConfig>: <error>" and exits 3.
const skewProgram = `package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ratekit/ratekit"
%s)

type allower interface {
	Allow(context.Context, ratekit.Request) (ratekit.Decision, error)
}

func main() {
	ctx := context.Background()
	l, cleanup, err := limiter(ctx)
	if err != nil {
		cleanup()
		fmt.Printf("construct: invalidconfig=%%t: %%v\n", errors.Is(err, ratekit.ErrInvalidConfig), err)
		os.Exit(3)
	}
	key := fmt.Sprintf("skew-%%d", time.Now().UnixNano())
	var got []bool
	for i, n := range []int64{10000, 5000, 190, 1000} {
		if i == 2 {
			time.Sleep(200 * time.Millisecond)
		}
		d, err := l.Allow(ctx, ratekit.Request{Key: key, Cost: n})
		if err != nil {
			cleanup()
			fmt.Printf("decide %%d: %%v\n", n, err)
			os.Exit(1)
		}
		got = append(got, d.Allowed)
	}
	cleanup()
	fmt.Printf("decisions: %%v\n", got)
}

%s`

// skewWant is skewProgram's output when the pair decides exactly.
const skewWant = "decisions: [true false true false]"

// tokenBucket is the token-bucket limiter of the KV stores' programs, once
// per name the capacity field has had.
var tokenBucket = []string{
	`tokenbucket.New(tokenbucket.Config{Name: "skew", Burst: 10000, RefillRate: tokenbucket.PerSecond(1000), Mode: tokenbucket.Atomic, Store: store})`,
	`tokenbucket.New(tokenbucket.Config{Name: "skew", Quota: 10000, RefillRate: tokenbucket.PerSecond(1000), Mode: tokenbucket.Atomic, Store: store})`,
}

// skewStores holds, for every store module, the variants of its program's
// imports and limiter function, one per shape its API and the root's have
// had; a pair's program is the first variant that builds.
var skewStores = map[string]func() (variants [][2]string){
	"kvstore/redisstore": kvStore(`
	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/kvstore/redisstore"
`, `	client := redis.NewClient(&redis.Options{Addr: os.Getenv("`+testenv.RedisEnv+`")})
	cleanup := func() { client.Close() }
	store, err := redisstore.New(client, redisstore.Config{Prefix: fmt.Sprintf("ratekit-skew:%d:", time.Now().UnixNano())})
`),
	"kvstore/rueidisstore": kvStore(`
	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit/kvstore/rueidisstore"
`, `	client, err := rueidis.NewClient(*rueidisstore.ServerlessOptions(&rueidis.ClientOption{InitAddress: []string{os.Getenv("`+testenv.RedisEnv+`")}}, 0))
	if err != nil {
		return nil, func() {}, err
	}
	cleanup := client.Close
	store, err := rueidisstore.New(client, rueidisstore.Config{Prefix: fmt.Sprintf("ratekit-skew:%d:", time.Now().UnixNano())})
`),
	"kvstore/dynamostore": kvStore(`
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratekit/ratekit/kvstore/dynamostore"
`, `	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(os.Getenv("`+testenv.DynamoDBEnv+`")),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "ratekit skew test"}, nil
		}),
	})
	table := fmt.Sprintf("ratekit-skew-%d", time.Now().UnixNano())
	cleanup := func() {}
	// dynalite has no Time to Live; the store checks expiry itself.
	if err := dynamostore.CreateTable(ctx, client, table); err != nil && !errors.Is(err, dynamostore.ErrNoTTL) {
		return nil, cleanup, err
	}
	cleanup = func() { client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)}) }
	store, err := dynamostore.New(client, dynamostore.Config{Table: table})
`),
	"durable": func() (v [][2]string) {
		// The PostgreSQL store was the module …/pgstore before it moved
		// into durable, and the algorithm was durable.Config's before it
		// became the Policy's.
		config := []string{
			`durable.Config{Store: store, Policy: ratekit.Policy{Name: "skew", Quota: 10000, Window: 10 * time.Second, Algorithm: ratekit.TokenBucket}, Prefix: "skew", Durability: durable.Unlogged}`,
			`durable.Config{Store: store, Algorithm: ratekit.TokenBucket, Policy: ratekit.Policy{Name: "skew", Quota: 10000, Window: 10 * time.Second}, Prefix: "skew", Durability: durable.Unlogged}`,
		}
		for _, pg := range []string{"durable/pgstore", "pgstore"} {
			for _, c := range config {
				v = append(v, [2]string{`
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/` + pg + `"
`, `func limiter(ctx context.Context) (allower, func(), error) {
	pool, err := pgxpool.New(ctx, os.Getenv("` + pgstoretest.PostgresEnv + `"))
	if err != nil {
		return nil, func() {}, err
	}
	schema := fmt.Sprintf("ratekit_skew_%d", time.Now().UnixNano())
	cleanup := func() {
		pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		pool.Close()
	}
	store, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		return nil, cleanup, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, cleanup, err
	}
	l, err := durable.New(` + c + `)
	return l, cleanup, err
}
`})
			}
		}
		return v
	},
}

// kvStore returns the program variants of a key-value store module: its
// imports besides tokenbucket, and open, the lines of limiter that set
// store, err and cleanup; each variant then builds one of tokenBucket's
// limiters over store.
func kvStore(imports, open string) func() [][2]string {
	return func() (v [][2]string) {
		for _, tb := range tokenBucket {
			v = append(v, [2]string{imports + `	"github.com/ratekit/ratekit/tokenbucket"
`, `func limiter(ctx context.Context) (allower, func(), error) {
` + open + `	if err != nil {
		return nil, cleanup, err
	}
	l, err := ` + tb + `
	return l, cleanup, err
}
`})
		}
		return v
	}
}

// notStores are the library modules (by directory) that hold no store, so
// have no program in skewStores: they decide nothing against a server.
var notStores = map[string]bool{"": true, "lambda": true, "otelratekit": true, "breaker": true}

// skewSide is one version of every module: a tree of the repository at a
// commit (or the working tree) whose go.mod files require their ratekit
// siblings at version and replace none, as a release writes them.
type skewSide struct {
	name, version, tree string
	mods                map[string]string // module path -> its directory in tree
}

// TestVersionSkew serves every module of the repository at the base commit
// ($RATEKIT_SKEW_BASE, default 4973956) as v0.1.0 and at the head ($RATEKIT_SKEW_HEAD,
// default the working tree) as v0.2.0 through a file proxy. For every store
// module S it builds, in a fresh user module, S@v0.1.0 under the root at
// v0.2.0 (a requirement of the user's), and S@v0.2.0 under the root at
// v0.1.0 (a replace of the user's), and runs skewProgram on the test
// servers. Each mixed pair must fail to build, fail at construction with an
// error matching ratekit.ErrInvalidConfig that names both protocol
// versions, or decide exactly; each side with itself must decide exactly
// (which also shows the programs build against either side's API).
func TestVersionSkew(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("no go command")
	}
	servers := []string{
		testenv.RedisEnv + "=" + testenv.RedisAddr(t),
		pgstoretest.PostgresEnv + "=" + pgstoretest.PostgresURL(t),
		testenv.DynamoDBEnv + "=" + testenv.DynamoDBEndpoint(t),
	}
	base := os.Getenv(skewBaseEnv)
	if base == "" {
		base = defaultSkewBase
	}
	old := skewTree(t, base, oldVersion)
	head := skewTree(t, os.Getenv(skewHeadEnv), newVersion)
	proxy := skewProxy(t, old, head)
	env := modproxy.UserEnv(t, proxy)
	// The simulated modules are in no checksum database; the others come
	// from the machine's cache. The programs find the servers in env.
	env = append(append(env, "GOSUMDB=off"), servers...)
	goVersion := strings.TrimPrefix(strings.TrimSpace(modproxy.MustRun(t, "", env, "go", "env", "GOVERSION")), "go")
	bin := t.TempDir()

	for path := range head.mods {
		dir := strings.TrimPrefix(strings.TrimPrefix(path, root), "/")
		if _, ok := skewStores[dir]; !ok && !notStores[dir] && !strings.HasPrefix(dir, "internal/") {
			t.Errorf("module %s is in neither skewStores nor notStores: give it a program, or say it keeps no state", path)
		}
	}
	for _, s := range slices.Sorted(maps.Keys(skewStores)) {
		path := root + "/" + s
		t.Run(s, func(t *testing.T) {
			for _, pair := range []struct {
				store, rootSide *skewSide
			}{{old, old}, {head, head}, {old, head}, {head, old}} {
				name := fmt.Sprintf("%s@%s with root@%s", s, pair.store.version, pair.rootSide.version)
				if pair.store.mods[path] == "" {
					t.Logf("%s: %s has no module %s", name, pair.store.name, path)
					continue
				}
				control := pair.store == pair.rootSide
				start := time.Now()
				out, built := runSkewPair(t, env, goVersion, bin, path, s, pair.store, pair.rootSide)
				switch outcome := skewOutcome(built, out); {
				case outcome == "decides exactly":
					t.Logf("%s: decides exactly (built and run in %v)", name, time.Since(start).Round(time.Second))
				case control:
					t.Errorf("%s (%s with itself): %s, want %q; the program or the servers are wrong, not the skew:\n%s", name, pair.store.name, outcome, skewWant, out)
				case outcome == "fails to build" || outcome == "fails at construction":
					t.Logf("%s: %s:\n%s", name, outcome, modproxy.FirstLines(out, 8))
				default:
					t.Errorf("%s (store at %s, root at %s): %s, want it to fail to build, fail at construction naming both versions, or print %q:\n%s",
						name, pair.store.name, pair.rootSide.name, outcome, skewWant, out)
				}
			}
		})
	}
}

// skewOutcome classifies what building and running a pair's program gave.
func skewOutcome(built bool, out string) string {
	switch {
	case !built && strings.Contains(out, root):
		return "fails to build"
	case !built:
		return "fails to build for a reason that is not ratekit's"
	case strings.Contains(out, skewWant):
		return "decides exactly"
	}
	if m := regexp.MustCompile(`construct: invalidconfig=(true|false): (.*)`).FindStringSubmatch(out); m != nil {
		if m[1] == "true" && namesTwoVersions(m[2]) {
			return "fails at construction"
		}
		return "fails at construction without an error that matches ratekit.ErrInvalidConfig and names both versions"
	}
	if strings.Contains(out, "decisions: ") {
		return "decides differently: a silent mis-decision"
	}
	return "fails at decision time"
}

// namesTwoVersions reports whether msg speaks of a version (or protocol)
// and holds two different numbers.
func namesTwoVersions(msg string) bool {
	if !regexp.MustCompile(`(?i)version|protocol`).MatchString(msg) {
		return false
	}
	nums := regexp.MustCompile(`\d+(\.\d+)*`).FindAllString(msg, -1)
	slices.Sort(nums)
	return len(slices.Compact(nums)) >= 2
}

// runSkewPair builds, in a fresh user module, the store module at path from
// the store side with the root from rootSide, trying the store's program
// variants in turn, and runs the first that builds. It returns the
// program's output (or the first variant's build output) and whether a
// variant built.
func runSkewPair(t *testing.T, env []string, goVersion, bin, path, store string, storeSide, rootSide *skewSide) (string, bool) {
	t.Helper()
	dir := t.TempDir()
	gomod := fmt.Sprintf("module example.com/skewuser\n\ngo %s\n\nrequire %s %s\n", goVersion, path, storeSide.version)
	switch {
	case rootSide == storeSide:
	case rootSide.version > storeSide.version:
		gomod += fmt.Sprintf("\nrequire %s %s\n", root, rootSide.version)
	default:
		gomod += fmt.Sprintf("\nreplace %s => %s %s\n", root, root, rootSide.version)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(bin, strings.ReplaceAll(store, "/", "_")+"-"+storeSide.version+"-"+rootSide.version)
	var first string
	for i, v := range skewStores[store]() {
		src := fmt.Sprintf(skewProgram, v[0], v[1])
		if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		// No go mod tidy: with -mod=mod the build adds what it needs, and
		// only that is downloaded (tidy would fetch every test dependency).
		// -trimpath keeps the module cache's temporary directory out of the
		// build cache's keys, so the client libraries compile once per
		// machine rather than once per run.
		out, err := modproxy.Run(dir, env, "go", "build", "-trimpath", "-o", exe, ".")
		if err != nil {
			if i == 0 {
				first = out
			}
			continue
		}
		got, _ := modproxy.Run(dir, env, exe)
		return got, true
	}
	return first, false
}

// skewTree returns the side at commit (the working tree when commit is
// empty): a copy of the repository with the release's go.mod files.
func skewTree(t *testing.T, commit, version string) *skewSide {
	t.Helper()
	tree := t.TempDir()
	s := &skewSide{name: commit, version: version, tree: tree, mods: map[string]string{}}
	if commit == "" {
		s.name = "the working tree"
		modproxy.CopyWorkingTree(t, repo, tree)
	} else {
		modproxy.Archive(t, repo, commit, tree, "(a clone needs the history: fetch it, or set "+skewBaseEnv+")")
	}
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tree, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "node_modules" || rel == "examples" || rel == "benchmarks" || rel == "internal/itest") {
			return filepath.SkipDir
		}
		if d.Name() != "go.mod" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := modfile.Parse(p, b, nil)
		if err != nil {
			return err
		}
		for _, r := range f.Require {
			if modproxy.IsRatekit(r.Mod.Path) {
				f.AddRequire(r.Mod.Path, version)
			}
		}
		for _, r := range slices.Clone(f.Replace) {
			if modproxy.IsRatekit(r.Old.Path) {
				f.DropReplace(r.Old.Path, r.Old.Version)
			}
		}
		f.Cleanup()
		out, err := f.Format()
		if err != nil {
			return err
		}
		s.mods[f.Module.Mod.Path] = filepath.Dir(p)
		return os.WriteFile(p, out, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// skewProxy writes a file-based module proxy serving every module of the
// sides at their versions.
func skewProxy(t *testing.T, sides ...*skewSide) string {
	t.Helper()
	dir := t.TempDir()
	for _, s := range sides {
		modproxy.Serve(t, dir, s.version, s.mods)
	}
	return dir
}
