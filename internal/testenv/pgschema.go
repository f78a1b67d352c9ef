package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit/internal/leakcheck"
)

// What the PostgreSQL tests of every module share without a client
// library: a schema of their own per test binary, unique key prefixes, and
// a TestMain that checks for leaks and drops the schema. The pgx half
// (pools, dropping) lives in each module's pgtest package.

var (
	pgSchema     = sync.OnceValue(func() string { return NewPGSchema() })
	pgSchemaUsed atomic.Bool
)

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// PGSchema returns this test binary's own schema name and marks it for
// PGMain to drop.
func PGSchema() string {
	pgSchemaUsed.Store(true)
	return pgSchema()
}

// NewPGSchema returns a fresh schema name that no other test binary uses.
func NewPGSchema() string { return "ratekit_test_" + randHex(6) }

// PGPrefix returns a key prefix no other test uses: the test's name, made
// a valid policy name, and random bytes.
func PGPrefix(t testing.TB) string {
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

// ignoreToxiproxy is the goroutine toxiproxy's latency toxic leaves parked.
const ignoreToxiproxy = "github.com/Shopify/toxiproxy/v2/toxics.(*LatencyToxic).Pipe"

// PGMain is a TestMain for PostgreSQL tests: it runs m, fails the binary
// when goroutines leak, and drops this binary's schema with drop when a
// test used it.
func PGMain(m *testing.M, drop func(schema string) error) {
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
	if err := DropPGSchema(drop); err != nil {
		fmt.Fprintln(os.Stderr, "drop test schema:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// DropPGSchema drops this binary's schema with drop when a test used it.
func DropPGSchema(drop func(schema string) error) error {
	if !pgSchemaUsed.Load() {
		return nil
	}
	return drop(pgSchema())
}
