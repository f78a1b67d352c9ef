// Package pgtest is the pgx half of the PostgreSQL test helpers (the other
// half, which needs no client library, is in internal/testenv): pools on
// the test server, dropping schemas, and the names tests use.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratekit/ratekit/internal/testenv"
)

// Schema is this test binary's own schema (see testenv.PGSchema).
func Schema() string { return testenv.PGSchema() }

// NewSchema returns a fresh schema name that the caller must drop.
func NewSchema() string { return testenv.NewPGSchema() }

// Prefix returns a key prefix unique to t.
func Prefix(t testing.TB) string { return testenv.PGPrefix(t) }

// Main is TestMain for packages that use Schema.
func Main(m *testing.M) { testenv.PGMain(m, Drop) }

// DropSchema drops Schema when a test used it.
func DropSchema() error { return testenv.DropPGSchema(Drop) }

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

// Drop drops schema name with everything in it, on the server named by
// RATEKIT_POSTGRES_URL (or the default).
func Drop(name string) error {
	url := os.Getenv(testenv.PostgresEnv)
	if url == "" {
		url = testenv.DefaultPostgresURL
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

// BatchCounter is a pgx tracer that counts the statements a pool sends and
// the batched decisions among them.
type BatchCounter struct {
	Statements atomic.Int64
	Batches    atomic.Int64
}

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
