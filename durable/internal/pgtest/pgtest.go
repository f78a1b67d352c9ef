// Package pgtest holds the helpers that pgstore's and durable's tests share:
// pools on the test servers, a schema of their own per test binary (dropped
// by TestMain) and unique key prefixes per test.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratekit/ratekit/internal/leakcheck"
	"github.com/ratekit/ratekit/internal/testenv"
)

var (
	schema = "ratekit_test_" + randHex(6)
	used   atomic.Bool
)

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// Schema returns this test binary's own schema name and marks it for
// DropSchema.
func Schema() string {
	used.Store(true)
	return schema
}

// NewSchema returns a fresh schema name that the caller must drop.
func NewSchema() string { return "ratekit_test_" + randHex(6) }

// Prefix returns a key prefix unique to t: its name with characters outside
// a policy name replaced, truncated, and a random suffix.
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
	return name + ":" + randHex(6)
}

// Pool returns a pool on url with at most maxConns connections and the given
// application_name, closed when the test ends. It keeps pgx's default query
// execution mode (cache_statement), so tests through PgBouncer show that the
// store does not depend on the pool's mode.
func Pool(t testing.TB, url string, maxConns int32, appName string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	cfg.MaxConns = maxConns
	if appName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
	}
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

// DropSchema drops the schema returned by Schema if a test used it. Call it
// from TestMain after m.Run.
func DropSchema() error {
	if !used.Load() {
		return nil
	}
	return Drop(schema)
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
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, err = pool.Exec(ctx, fmt.Sprintf(`DROP SCHEMA IF EXISTS "%s" CASCADE`, name))
	return err
}

// ignoreToxiproxy ignores a goroutine of toxiproxy (v2.5.0) itself: under
// load, a latency toxic's goroutine can stay blocked on a send to a toxic
// that was swapped out meanwhile (package faultproxy adds and removes a
// reset_peer toxic every period); seen twice in full runs beside two
// CPU-bound processes. It holds no connection of the test's.
const ignoreToxiproxy = "github.com/Shopify/toxiproxy/v2/toxics.(*LatencyToxic).Pipe"

// Main runs the tests of m, then fails the binary if a goroutine leaked
// (leakcheck) or if DropSchema fails, and exits. Call it as TestMain's body in
// packages whose tests use Schema. Connections broken by injected faults
// close asynchronously: pgconn sends a cancel request and Terminate, then
// drains the socket in a goroutine bounded by a 15-second deadline (pgx
// v5.12, PgConn.asyncClose). So a leak is reported only if it is still
// there after 20 seconds; on an idle machine the goroutines are gone at once.
func Main(m *testing.M) {
	code := m.Run()
	err := leakcheck.Find(ignoreToxiproxy)
	for deadline := time.Now().Add(20 * time.Second); err != nil && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		err = leakcheck.Find(ignoreToxiproxy)
	}
	if err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
		code = 1
	}
	if err := DropSchema(); err != nil {
		fmt.Fprintln(os.Stderr, "drop test schema:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
