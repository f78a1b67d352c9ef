package pgengine

import (
	"strings"
	"testing"

	"github.com/ratekit/ratekit"
)

// TestMigrationLockID checks the constant written out in schema.go against
// the hash it stands for.
func TestMigrationLockID(t *testing.T) {
	if got := hashBytes([]byte("ratekit/pgstore/migrate")); got != migrationLockID {
		t.Fatalf("hashBytes(\"ratekit/pgstore/migrate\") = %d, migrationLockID = %d", got, migrationLockID)
	}
}

// TestCodes holds the codes table (codes.go) to what schema.sql reads from
// it: every name the SQL uses is in the table (SchemaSQL fails otherwise),
// every operation and algorithm in the table is used, no bare code is
// compared with, and every algorithm has its own code.
func TestCodes(t *testing.T) {
	if _, err := SchemaSQL(DefaultSchema); err != nil {
		t.Fatal(err)
	}
	for name := range sqlCodes["op"] {
		if !strings.Contains(schemaSource, `op "`+name+`"`) {
			t.Errorf("schema.sql never uses {{op %q}}", name)
		}
	}
	if len(compositeAlgorithms) != len(sqlCodes["alg"]) {
		t.Errorf("the composite has %d algorithms, the codes table %d", len(compositeAlgorithms), len(sqlCodes["alg"]))
	}
	for _, name := range compositeAlgorithms {
		if _, ok := sqlCodes["alg"][name]; !ok {
			t.Errorf("algorithm %q has no code", name)
		}
	}
	for _, bare := range []string{"p_op = 0", "p_op = 1", "p_op = 2", "p_op <> 1", "p_algs[i] = 4", "get_byte"} {
		if strings.Contains(schemaSource, bare) {
			t.Errorf("schema.sql compares with a bare code: %q", bare)
		}
	}
	seen := map[int64]ratekit.Algorithm{}
	for _, a := range []ratekit.Algorithm{ratekit.FixedWindow, ratekit.SlidingWindow, ratekit.TokenBucket, ratekit.SlidingLog} {
		c := algCode(a)
		if c == 0 || c == algPeriod {
			t.Errorf("algCode(%v) = %d", a, c)
		}
		if b, ok := seen[c]; ok {
			t.Errorf("algCode(%v) = algCode(%v) = %d", a, b, c)
		}
		seen[c] = a
	}
}

// TestTakeStatementReadsTheClockSparingly holds the take statements to the
// number of times they read lock_clock: each reading is a sub-plan that
// the server sets up on every call (about a microsecond each), and a lone
// caller waits for all of them. A token bucket reads it in its WHERE, in
// its two SET expressions and for its reset; a fixed window in its WHERE,
// its three SET expressions and for its reset. The clock read before the
// insert is a subquery, not a materialised CTE.
func TestTakeStatementReadsTheClockSparingly(t *testing.T) {
	for _, tc := range []struct {
		alg  string
		most int
	}{{"token_bucket", 4}, {"fixed_window", 5}} {
		for _, sync := range []bool{true, false} {
			q, err := takeSQL(`"s"`, Unlogged, tc.alg, sync)
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(q, "FROM lock_clock"); n > tc.most {
				t.Errorf("%s (sync %v): the take statement reads lock_clock %d times, want at most %d:\n%s", tc.alg, sync, n, tc.most, q)
			}
			ctes := 1 // lock_clock
			if !sync {
				ctes++ // sync_off
			}
			if n := strings.Count(q, "MATERIALIZED"); n > ctes {
				t.Errorf("%s (sync %v): %d materialised CTEs, want at most %d (lock_clock, sync_off):\n%s", tc.alg, sync, n, ctes, q)
			}
		}
	}
}
