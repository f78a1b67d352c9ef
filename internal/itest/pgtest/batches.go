package pgtest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BatchCounter is a pgx.QueryTracer that counts statements, and among them
// the pgstore statements that carry more than one decision (coalescing). It
// is safe for concurrent use.
type BatchCounter struct {
	Statements atomic.Int64
	Batches    atomic.Int64
}

// TraceQueryStart counts the statement.
func (b *BatchCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	b.Statements.Add(1)
	if strings.HasPrefix(data.SQL, "/* ratekit batch */") {
		b.Batches.Add(1)
	}
	return ctx
}

// TraceQueryEnd does nothing.
func (b *BatchCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TracedPool is Pool with tracer on every connection.
func TracedPool(t testing.TB, url string, maxConns int32, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.Tracer = tracer
	cfg.PingTimeout = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pool on %s: %v", url, err)
	}
	t.Cleanup(pool.Close)
	return pool
}
