// Package release_test installs ratekit as a user would: it cuts a release
// with scripts/release.sh in a copy of the working tree, serves every
// library module of the release commit from a file-based module proxy,
// then, in a fresh user module per library module, runs the README's `go
// get` line, builds the README's code, tidies and verifies the module, and
// checks `go list -m all`: ratekit's library modules, the client library a
// module exists for and that library's own requirements, nothing else; and
// it installs ratekit-schema with `go install …@version`. The skew test
// beside it (internal/itest/skew) pairs store modules and the root at two
// versions.
package release_test

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"

	"github.com/ratekit/ratekit/internal/itest/modproxy"
)

const root = modproxy.Root

// clients lists, for every library module, the client library it exists
// for: a user's graph may hold these and what they require.
var clients = map[string][]string{
	root:                           {},
	root + "/durable":              {"github.com/jackc/pgx/v5"},
	root + "/kvstore/redisstore":   {"github.com/redis/go-redis/v9"},
	root + "/kvstore/rueidisstore": {"github.com/redis/rueidis"},
	root + "/kvstore/dynamostore":  {"github.com/aws/aws-sdk-go-v2", "github.com/aws/aws-sdk-go-v2/service/dynamodb", "github.com/aws/smithy-go"},
	root + "/lambda":               {"github.com/aws/aws-lambda-go"},
	root + "/otelratekit":          {"go.opentelemetry.io/otel", "go.opentelemetry.io/otel/metric", "go.opentelemetry.io/otel/trace"},
	root + "/breaker":              {"github.com/sony/gobreaker/v2"},
}

// programs holds a program for each library module that the README shows
// no code of; the README's own blocks are built for the others.
var programs = map[string]string{
	root + "/kvstore/rueidisstore": `package main

import (
	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

func main() {
	client, err := rueidis.NewClient(*rueidisstore.ServerlessOptions(&rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}}, 0))
	if err != nil {
		panic(err)
	}
	store, err := rueidisstore.New(client, rueidisstore.Config{Prefix: "app:"})
	if err != nil {
		panic(err)
	}
	_, err = tokenbucket.New(tokenbucket.Config{Name: "api", Burst: 10, RefillRate: tokenbucket.PerSecond(5), Mode: tokenbucket.Atomic, Store: store})
	_ = err
}
`,
	root + "/kvstore/dynamostore": `package main

import (
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/tokenbucket"
)

func main() {
	client := dynamodb.New(dynamodb.Options{Region: "eu-west-1", Credentials: aws.AnonymousCredentials{}})
	store, err := dynamostore.New(client, dynamostore.Config{Table: "ratekit"})
	if err != nil {
		panic(err)
	}
	_, err = tokenbucket.New(tokenbucket.Config{Name: "api", Burst: 10, RefillRate: tokenbucket.PerSecond(5), Mode: tokenbucket.Atomic, Store: store})
	_ = err
}
`,
	root + "/otelratekit": `package main

import (
	"go.opentelemetry.io/otel"

	"github.com/ratekit/ratekit/otelratekit"
)

func main() {
	_, err := otelratekit.NewObserver(otelratekit.Config{MeterProvider: otel.GetMeterProvider(), TracerProvider: otel.GetTracerProvider(), Strategy: "tokenbucket", Store: "memory"})
	_ = err
}
`,
	root + "/breaker": `package main

import (
	"github.com/ratekit/ratekit/breaker"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

func main() {
	store, _ := memstore.New(memstore.Config{MaxKeys: 1000})
	l, _ := tokenbucket.New(tokenbucket.Config{Name: "api", Burst: 10, RefillRate: tokenbucket.PerSecond(5), Mode: tokenbucket.Atomic, Store: store})
	_, err := breaker.New(l, breaker.Config{})
	_ = err
}
`,
}

// repo is the repository's root, from this package's directory.
const repo = "../../.."

type mod struct {
	path, dir string
	file      *modfile.File
}

// libraryModules reads every go.mod of the repository tree at dir and
// returns the library modules: all but the examples, the benchmarks and
// internal/.
func libraryModules(t *testing.T, dir string) []mod {
	t.Helper()
	var mods []mod
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.Name() != "go.mod" {
			return nil
		}
		rel, _ := filepath.Rel(dir, filepath.Dir(p))
		rel = filepath.ToSlash(rel)
		if rel == "examples" || rel == "benchmarks" || strings.HasPrefix(rel, "examples/") || strings.HasPrefix(rel, "benchmarks/") || strings.HasPrefix(rel, "internal/") {
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
		mods = append(mods, mod{path: f.Module.Mod.Path, dir: filepath.Dir(p), file: f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return mods
}

// releaseVersion returns the one version at which the library modules
// require each other, failing t when a requirement names another version,
// a pseudo-version or a module that is not a library module.
func releaseVersion(t *testing.T, mods []mod) string {
	t.Helper()
	lib := map[string]bool{}
	for _, m := range mods {
		lib[m.path] = true
	}
	version := ""
	for _, m := range mods {
		for _, r := range m.file.Require {
			if !strings.HasPrefix(r.Mod.Path, root) {
				continue
			}
			switch {
			case !lib[r.Mod.Path]:
				t.Errorf("%s requires %s, which is not a library module: a user's go would fetch it", m.path, r.Mod.Path)
			case !semver.IsValid(r.Mod.Version) || module.IsPseudoVersion(r.Mod.Version) || r.Mod.Version == "v0.0.0":
				t.Errorf("%s requires %s at %s, a version no release has", m.path, r.Mod.Path, r.Mod.Version)
			case version != "" && r.Mod.Version != version:
				t.Errorf("%s requires %s at %s, others at %s", m.path, r.Mod.Path, r.Mod.Version, version)
			default:
				version = r.Mod.Version
			}
		}
	}
	if version == "" {
		t.Fatal("no library module requires a sibling: cannot tell the release version")
	}
	if t.Failed() {
		t.FailNow()
	}
	return version
}

// buildProxy writes a file-based module proxy holding every module of mods
// at version.
func buildProxy(t *testing.T, mods []mod, version string) string {
	t.Helper()
	dir := t.TempDir()
	dirs := map[string]string{}
	for _, m := range mods {
		dirs[m.path] = m.dir
	}
	modproxy.Serve(t, dir, version, dirs)
	return dir
}

// readmeGoGets returns the README's `go get` lines by module path.
func readmeGoGets(t *testing.T, readme string) map[string]string {
	t.Helper()
	out := map[string]string{}
	re := regexp.MustCompile(`(?m)^go get (github\.com/ratekit/ratekit[^@\s]*)@(\S+)`)
	for _, m := range re.FindAllStringSubmatch(readme, -1) {
		out[m[1]] = m[0]
	}
	return out
}

// readmeBlocks returns the README's Go blocks.
func readmeBlocks(readme string) []string {
	var blocks []string
	var cur *strings.Builder
	sc := bufio.NewScanner(strings.NewReader(readme))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && line == "```go":
			cur = &strings.Builder{}
		case cur != nil && line == "```":
			blocks = append(blocks, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		}
	}
	return blocks
}

// imports maps the package names README blocks use to import paths.
var imports = map[string]string{
	"context":      "context",
	"http":         "net/http",
	"time":         "time",
	"ratekit":      root,
	"signedwindow": root + "/signedwindow",
	"httplimit":    root + "/httplimit",
	"tokenbucket":  root + "/tokenbucket",
	"memstore":     root + "/kvstore/memstore",
	"redisstore":   root + "/kvstore/redisstore",
	"redis":        "github.com/redis/go-redis/v9",
	"durable":      root + "/durable",
	"pgstore":      root + "/durable/pgstore",
	"pgxpool":      "github.com/jackc/pgx/v5/pgxpool",
	"lambda":       root + "/lambda",
	"awslambda":    "github.com/aws/aws-lambda-go/lambda",
	"events":       "github.com/aws/aws-lambda-go/events",
}

// free declares, at package level, the names README blocks use without
// declaring them (package-level variables may go unused).
var free = map[string]string{
	"ctx":             "var ctx context.Context",
	"cfg":             "var cfg *pgxpool.Config",
	"secret":          "var secret []byte",
	"contactHandler":  "var contactHandler http.Handler",
	"apiKey":          "var apiKey string",
	"lambdaRequestID": "var lambdaRequestID string",
	"addrs":           "var addrs []string",
	"store":           "var store *pgstore.Store",
	"limiter":         "var limiter ratekit.Limiter",
	"handle":          "func handle(ctx context.Context, e events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) { return events.APIGatewayV2HTTPResponse{}, nil }",
}

// program turns a README block into a program: the block is main's body,
// followed by a use of every variable it declares; the names it uses
// without declaring come from free, its imports from imports.
func program(t *testing.T, block string) (string, []string) {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "block.go", "package p\nfunc main() {\n"+block+"\n}\n", 0)
	if err != nil {
		t.Fatalf("README block does not parse as statements: %v\n%s", err, block)
	}
	declared := map[string]bool{}
	var order []string
	used := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				for _, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok && id.Name != "_" && !declared[id.Name] {
						declared[id.Name] = true
						order = append(order, id.Name)
					}
				}
			}
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok {
				used[id.Name] = true
			}
		case *ast.Ident:
			used[n.Name] = true
		}
		return true
	})
	var decls []string
	for name, decl := range free {
		if used[name] && !declared[name] {
			decls = append(decls, decl)
			for pkg := range imports {
				if strings.Contains(decl, pkg+".") {
					used[pkg] = true
				}
			}
		}
	}
	slices.Sort(decls)
	var paths []string
	for pkg, path := range imports {
		if used[pkg] {
			paths = append(paths, path)
		}
	}
	slices.Sort(paths)
	var b strings.Builder
	b.WriteString("package main\n\nimport (\n")
	for _, p := range paths {
		name := ""
		if p == "github.com/aws/aws-lambda-go/lambda" {
			name = "awslambda "
		}
		fmt.Fprintf(&b, "\t%s%q\n", name, p)
	}
	b.WriteString(")\n\n" + strings.Join(decls, "\n") + "\n\nfunc main() {\n" + block)
	for _, name := range order {
		fmt.Fprintf(&b, "\t_ = %s\n", name)
	}
	b.WriteString("}\n")
	return b.String(), paths
}

// moduleOf returns the library module that provides import path p, or "".
func moduleOf(p string, mods []mod) string {
	best := ""
	for _, m := range mods {
		if (p == m.path || strings.HasPrefix(p, m.path+"/")) && len(m.path) > len(best) {
			best = m.path
		}
	}
	return best
}

func TestInstallAsAUser(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("no go command")
	}
	version := nextVersion(t, releaseVersion(t, libraryModules(t, repo)))
	tree := cutRelease(t, version)
	mods := libraryModules(t, tree)
	for _, m := range mods {
		if _, ok := clients[m.path]; !ok {
			t.Fatalf("library module %s is not in this test's table of client libraries", m.path)
		}
	}
	for _, m := range mods {
		for _, r := range m.file.Replace {
			if strings.HasPrefix(r.Old.Path, root) {
				t.Errorf("%s's released go.mod replaces %s: `go install …@%s` would refuse it", m.path, r.Old.Path, version)
			}
		}
	}
	if v := releaseVersion(t, mods); v != version {
		t.Fatalf("the release commit's go.mod files require siblings at %s, want %s", v, version)
	}
	proxy := buildProxy(t, mods, version)

	readme, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	gets := readmeGoGets(t, string(readme))
	for _, m := range mods {
		if gets[m.path] == "" {
			t.Errorf("the README has no `go get %s@…` line", m.path)
		}
	}
	// Each README block is built by the user of the library module it
	// needs beyond the root (the root's user when it needs none).
	code := map[string][]string{}
	for _, block := range readmeBlocks(string(readme)) {
		if strings.HasPrefix(strings.TrimSpace(block), "type ") {
			continue // a declaration shown for reading, not a program
		}
		src, paths := program(t, block)
		user := root
		for _, p := range paths {
			if m := moduleOf(p, mods); m != "" && m != root {
				user = m
			}
		}
		code[user] = append(code[user], src)
	}
	for path, src := range programs {
		code[path] = append(code[path], src)
	}

	env := modproxy.UserEnv(t, proxy)

	t.Run("go install ratekit-schema", func(t *testing.T) {
		gobin := t.TempDir()
		c := exec.Command("go", "install", "-trimpath", root+"/durable/pgstore/cmd/ratekit-schema@"+version)
		c.Dir = t.TempDir()
		c.Env = append(slices.DeleteFunc(slices.Clone(env), func(e string) bool { return strings.HasPrefix(e, "GOFLAGS=") }), "GOBIN="+gobin)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("go install ratekit-schema@%s: %v\n%s", version, err, out)
		}
		out, err := exec.Command(filepath.Join(gobin, "ratekit-schema"), "-schema", "ratekit_release").CombinedOutput()
		if err != nil || !strings.Contains(strings.ToUpper(string(out)), "CREATE") {
			t.Fatalf("ratekit-schema: %v\n%s", err, modproxy.FirstLines(string(out), 20))
		}
	})

	for _, m := range mods {
		name := strings.TrimPrefix(strings.TrimPrefix(m.path, root), "/")
		if name == "" {
			name = "root"
		}
		t.Run(name, func(t *testing.T) {
			srcs := code[m.path]
			if len(srcs) == 0 {
				t.Fatalf("no README block or program uses %s", m.path)
			}
			dir := t.TempDir()
			run := func(args ...string) string {
				t.Helper()
				c := exec.Command(args[0], args[1:]...)
				c.Dir = dir
				c.Env = env
				out, err := c.CombinedOutput()
				if err != nil {
					t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
				}
				return string(out)
			}
			run("go", "mod", "init", "example.com/user")
			run("sh", "-c", gets[m.path])
			for i, src := range srcs {
				sub := filepath.Join(dir, fmt.Sprintf("cmd%d", i))
				os.MkdirAll(sub, 0o755)
				if err := os.WriteFile(filepath.Join(sub, "main.go"), []byte(src), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			run("go", "mod", "tidy")
			if out, err := func() (string, error) {
				c := exec.Command("go", "build", "-trimpath", "-o", t.TempDir()+string(filepath.Separator), "./...")
				c.Dir, c.Env = dir, env
				o, err := c.CombinedOutput()
				return string(o), err
			}(); err != nil {
				t.Fatalf("go build: %v\n%s\nthe programs:\n%s", err, out, strings.Join(srcs, "\n----\n"))
			}
			run("go", "mod", "verify")
			list := strings.Fields(run("go", "list", "-m", "-f", "{{.Path}}", "all"))
			graph := run("go", "mod", "graph")
			checkList(t, m.path, list, graph, mods)
			t.Logf("%s user: go list -m all lists %d modules: %s", m.path, len(list), strings.Join(list, " "))
		})
	}
}

// checkList fails t when the user's module list holds a module that neither
// a ratekit library module the user installed nor its client library (with
// what that library requires) brings.
func checkList(t *testing.T, installed string, list []string, graph string, mods []mod) {
	t.Helper()
	edges := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(graph), "\n") {
		from, to, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		fp, _, _ := strings.Cut(from, "@")
		tp, _, _ := strings.Cut(to, "@")
		edges[fp] = append(edges[fp], tp)
	}
	allowed := map[string]bool{"example.com/user": true}
	var queue []string
	for _, l := range list {
		if strings.HasPrefix(l, root) {
			if _, ok := clients[l]; !ok {
				t.Errorf("the user's module list holds %s, which is not a library module", l)
				continue
			}
			allowed[l] = true
			queue = append(queue, clients[l]...)
		}
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if allowed[p] {
			continue
		}
		allowed[p] = true
		queue = append(queue, edges[p]...)
	}
	if !slices.Contains(list, installed) {
		t.Errorf("the user's module list lacks %s", installed)
	}
	for _, l := range list {
		if !allowed[l] {
			t.Errorf("a %s user's module list holds %s, which neither ratekit nor its client library requires", installed, l)
		}
	}
	if installed == root && len(list) != 2 {
		t.Errorf("a user of the root module alone lists %v, want the user's module and ratekit alone", list)
	}
}

// nextVersion returns the version after v: its minor version plus one.
func nextVersion(t *testing.T, v string) string {
	t.Helper()
	var major, minor, patch int
	if _, err := fmt.Sscanf(semver.Canonical(v), "v%d.%d.%d", &major, &minor, &patch); err != nil {
		t.Fatalf("version %s: %v", v, err)
	}
	return fmt.Sprintf("v%d.%d.0", major, minor+1)
}

// cutRelease runs scripts/release.sh version --tag in a git repository
// holding a copy of the working tree, after checking that it refuses a
// dirty tree, and returns the tree of the commit the tags name. It fails t
// unless every library module's tag names one commit, the script's own,
// the script left the tree clean, and the commit after the release has the
// library modules' replace lines back.
func cutRelease(t *testing.T, version string) string {
	t.Helper()
	clone := t.TempDir()
	modproxy.CopyWorkingTree(t, repo, clone)
	env := append(os.Environ(), "GIT_AUTHOR_NAME=release test", "GIT_AUTHOR_EMAIL=release@example.com",
		"GIT_COMMITTER_NAME=release test", "GIT_COMMITTER_EMAIL=release@example.com", "GOWORK=off", "GOTOOLCHAIN=local")
	modproxy.MustRun(t, clone, env, "git", "init", "-q")
	modproxy.MustRun(t, clone, env, "git", "add", "-A")
	modproxy.MustRun(t, clone, env, "git", "commit", "-q", "-m", "the working tree")
	base := strings.TrimSpace(modproxy.MustRun(t, clone, env, "git", "rev-parse", "HEAD"))

	if err := os.WriteFile(filepath.Join(clone, "durable", "go.mod"), []byte("module github.com/ratekit/ratekit/durable\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := modproxy.Run(clone, env, "bash", "scripts/release.sh", version, "--tag"); err == nil {
		t.Fatalf("release.sh released a dirty tree:\n%s", out)
	}
	if tags := modproxy.MustRun(t, clone, env, "git", "tag"); tags != "" || strings.TrimSpace(modproxy.MustRun(t, clone, env, "git", "rev-parse", "HEAD")) != base {
		t.Fatalf("release.sh refused a dirty tree but committed or tagged: tags %q", tags)
	}
	modproxy.MustRun(t, clone, env, "git", "checkout", "-q", "--", "durable/go.mod")

	out := modproxy.MustRun(t, clone, env, "bash", "scripts/release.sh", version, "--tag")
	t.Logf("release.sh %s --tag:\n%s", version, out)
	if st := modproxy.MustRun(t, clone, env, "git", "status", "--porcelain"); st != "" {
		t.Errorf("release.sh left the tree dirty:\n%s", st)
	}
	release := strings.TrimSpace(modproxy.MustRun(t, clone, env, "git", "rev-parse", version+"^{commit}"))
	if release == base {
		t.Fatalf("release.sh tagged the commit it was given, not one it made")
	}
	if subject := strings.TrimSpace(modproxy.MustRun(t, clone, env, "git", "log", "-1", "--format=%s", release)); subject != "release: "+version {
		t.Errorf("the tagged commit is %q, want the script's \"release: %s\"", subject, version)
	}
	// After the release commit, every library module builds against its
	// siblings in the tree again.
	for _, m := range libraryModules(t, clone) {
		for _, r := range m.file.Require {
			if modproxy.IsRatekit(r.Mod.Path) && !slices.ContainsFunc(m.file.Replace, func(rep *modfile.Replace) bool { return rep.Old.Path == r.Mod.Path }) {
				t.Errorf("after release.sh, %s requires %s with no replace line: the tree no longer builds from itself", m.path, r.Mod.Path)
			}
		}
	}
	tree := t.TempDir()
	modproxy.Archive(t, clone, release, tree, "")
	for _, m := range libraryModules(t, tree) {
		tag := version
		if m.path != root {
			tag = strings.TrimPrefix(m.path, root+"/") + "/" + version
		}
		if c, err := modproxy.Run(clone, env, "git", "rev-parse", tag+"^{commit}"); err != nil || strings.TrimSpace(c) != release {
			t.Errorf("tag %s: %s, want the release commit %s", tag, strings.TrimSpace(c), release)
		}
	}
	return tree
}
