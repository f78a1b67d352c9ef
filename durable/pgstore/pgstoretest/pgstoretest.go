// Package pgstoretest is what tests of code built on pgstore need against a
// real PostgreSQL server, as pgx's pgxtest is for pgx: the server's address,
// pools on it, a schema of the test binary's own that its TestMain drops,
// key prefixes no other test uses, and a tracer that counts statements.
//
// A test that needs a server it cannot reach is skipped with a message that
// says how to provide one, except in CI (the CI environment variable is
// set), where it fails: an integration test never passes there by skipping.
// The package is for tests; it connects to nothing until a test calls it.
package pgstoretest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The environment variables that name the servers, and the addresses used
// when they are empty: the PostgreSQL server of a development machine (trust
// authentication, database test) and a PgBouncer in transaction mode in
// front of it (.ci/pgbouncer.sh in ratekit's repository starts one).
const (
	PostgresEnv         = "RATEKIT_POSTGRES_URL"
	PgBouncerEnv        = "RATEKIT_PGBOUNCER_URL"
	DefaultPostgresURL  = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultPgBouncerURL = "postgres://postgres@127.0.0.1:6432/test?sslmode=disable"
)

// PostgresURL returns the connection string of the PostgreSQL server for
// tests ($RATEKIT_POSTGRES_URL or [DefaultPostgresURL]) once something
// listens at its address; otherwise it skips t, or fails it in CI.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return reachable(t, PostgresEnv, DefaultPostgresURL, "PostgreSQL")
}

// PgBouncerURL returns the connection string of a PgBouncer in transaction
// pooling mode in front of the test server ($RATEKIT_PGBOUNCER_URL or
// [DefaultPgBouncerURL]), as [PostgresURL] does.
func PgBouncerURL(t testing.TB) string {
	t.Helper()
	return reachable(t, PgBouncerEnv, DefaultPgBouncerURL, "PgBouncer (start it with: bash .ci/pgbouncer.sh)")
}

func reachable(t testing.TB, env, def, what string) string {
	t.Helper()
	raw := os.Getenv(env)
	if raw == "" {
		raw = def
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		t.Fatalf("pgstoretest: %s=%q is not a URL with a host: %v", env, raw, err)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "5432")
	}
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		conn.Close()
		return raw
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("pgstoretest: %s is not reachable at %s (%v); CI must provide it (set %s or start it in .ci/run)", what, addr, err, env)
	}
	t.Skipf("pgstoretest: skipping, %s is not reachable at %s (%v); set %s to run this test", what, addr, err, env)
	return ""
}

// Pool returns a pool on url of at most maxConns connections, named
// appName when not empty, closed when t ends.
func Pool(t testing.TB, url string, maxConns int32, appName string) *pgxpool.Pool {
	t.Helper()
	return pool(t, url, maxConns, func(cfg *pgxpool.Config) {
		if appName != "" {
			cfg.ConnConfig.RuntimeParams["application_name"] = appName
		}
	})
}

// TracedPool is Pool with tracer on every connection.
func TracedPool(t testing.TB, url string, maxConns int32, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	return pool(t, url, maxConns, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = tracer })
}

func pool(t testing.TB, url string, maxConns int32, set func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	cfg.MaxConns = maxConns
	cfg.PingTimeout = 2 * time.Second
	set(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pool on %s: %v", url, err)
	}
	t.Cleanup(p.Close)
	return p
}

var (
	schema     = sync.OnceValue(NewSchema)
	schemaUsed atomic.Bool
)

// Schema returns the test binary's own schema name, the same at every
// call, which [Main] drops at the end.
func Schema() string {
	schemaUsed.Store(true)
	return schema()
}

// NewSchema returns a fresh schema name that no other test binary uses; the
// caller drops it (see [Drop]).
func NewSchema() string { return "ratekit_test_" + randomHex(6) }

// Prefix returns a key prefix that no other test uses: t's name, made a
// valid policy name, a colon and random hex.
func Prefix(t testing.TB) string {
	name := strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '.'
	}, t.Name())
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	return name + ":" + randomHex(6)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// Main is a TestMain: it runs m, then each of checks (a leak check, say),
// then drops [Schema] when a test used it, and exits with m's code, or 1
// when a check or the drop failed.
func Main(m *testing.M, checks ...func() error) {
	code := m.Run()
	fail := func(what string, err error) {
		fmt.Fprintln(os.Stderr, what+":", err)
		if code == 0 {
			code = 1
		}
	}
	for _, check := range checks {
		if err := check(); err != nil {
			fail("check after the tests", err)
		}
	}
	if schemaUsed.Load() {
		if err := Drop(schema()); err != nil {
			fail("drop test schema", err)
		}
	}
	os.Exit(code)
}

// Drop drops schema name with everything in it, on the server named by
// $RATEKIT_POSTGRES_URL (or [DefaultPostgresURL]).
func Drop(name string) error {
	url := os.Getenv(PostgresEnv)
	if url == "" {
		url = DefaultPostgresURL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer p.Close()
	_, err = p.Exec(ctx, fmt.Sprintf(`DROP SCHEMA IF EXISTS "%s" CASCADE`, name))
	return err
}

// BatchCounter is a pgx tracer that counts the statements a pool sends and,
// among them, the coalesced batches of decisions: a statement that calls
// the batch function, or a pipeline of statements (one round trip, counted
// as one statement). It is safe for concurrent use.
type BatchCounter struct {
	Statements atomic.Int64
	Batches    atomic.Int64
}

// TraceBatchStart counts one statement and one batch.
func (b *BatchCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	b.Statements.Add(1)
	b.Batches.Add(1)
	return ctx
}

// TraceBatchQuery does nothing.
func (b *BatchCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd does nothing.
func (b *BatchCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TraceQueryStart counts one statement, and one batch when it is one.
func (b *BatchCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	b.Statements.Add(1)
	if strings.HasPrefix(data.SQL, "/* ratekit batch */") {
		b.Batches.Add(1)
	}
	return ctx
}

// TraceQueryEnd does nothing.
func (b *BatchCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
