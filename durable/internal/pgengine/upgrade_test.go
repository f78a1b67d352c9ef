package pgengine_test

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// TestMigrateUpgrades installs the schema as versions 15 and 16 created it
// (testdata/schema_v<version>.txt, the output of ratekit-schema at that
// version), counts with its functions, and then lets a Store of this
// version migrate it: the functions are replaced, the counts stay, and
// every decision function of this version runs, alone and in batches.
func TestMigrateUpgrades(t *testing.T) {
	for _, version := range []int{15, 16} {
		t.Run("v"+strconv.Itoa(version), func(t *testing.T) { testMigrateUpgrades(t, version) })
	}
}

func testMigrateUpgrades(t *testing.T, version int) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 4, "")
	ctx := ctxT(t)
	schema := pgstoretest.NewSchema()
	t.Cleanup(func() {
		if err := pgstoretest.Drop(schema); err != nil {
			t.Error(err)
		}
	})
	old, err := os.ReadFile("testdata/schema_v" + strconv.Itoa(version) + ".txt")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "BEGIN;\n"+strings.ReplaceAll(string(old), "{{SCHEMA}}", schema)+"\nCOMMIT;"); err != nil {
		t.Fatalf("install version %d: %v", version, err)
	}
	// The old fixed window takes 3 of 10 and its token bucket 4 of 10.
	for _, q := range []string{
		`SELECT "` + schema + `".fixed_window_unlogged(0, 'fixed', 'k'::bytea, 3, 10, 3600000000, 0, NULL, 3600000000, 0, true)`,
		`SELECT "` + schema + `".token_bucket_unlogged(0, 'bucket', 'k'::bytea, 4, 10, 360000000, 0, NULL, 3600000000, 0, true)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("version %d decision: %v", version, err)
		}
	}

	// One decision in flight: concurrent decisions go in batches.
	s, err := pgengine.New(pool, pgengine.Config{Schema: schema, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	fixed := newCounter(t, s, pgengine.CounterConfig{Prefix: "fixed", Algorithm: ratekit.FixedWindow, Quota: 10, Window: pgengine.FarWindow, Durability: pgengine.Unlogged})
	bucket := newCounter(t, s, pgengine.CounterConfig{Prefix: "bucket", Algorithm: ratekit.TokenBucket, Quota: 10, Window: time.Hour, Durability: pgengine.Unlogged})
	if o, err := fixed.Peek(ctx, "k", 1); err != nil || o.Remaining != 7 {
		t.Fatalf("fixed window after the upgrade: %+v, %v; want 7 remaining", o, err)
	}
	if o, err := bucket.Take(ctx, "k", 1, ""); err != nil || !o.Allowed || o.Remaining != 5 {
		t.Fatalf("token bucket after the upgrade: %+v, %v; want allowed, 5 remaining", o, err)
	}
	for _, alg := range []ratekit.Algorithm{ratekit.SlidingWindow, ratekit.SlidingLog} {
		c := newCounter(t, s, pgengine.CounterConfig{Prefix: alg.String(), Algorithm: alg, Quota: 10, Window: pgengine.FarWindow, Durability: pgengine.Unlogged})
		if o, err := c.Take(ctx, "k", 2, "once"); err != nil || !o.Allowed || o.Remaining != 8 {
			t.Fatalf("%v after the upgrade: %+v, %v", alg, o, err)
		}
	}
	m, err := pgengine.NewComposite(fixed, bucket)
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Take(ctx, "k", 1, nil, "")
	if err != nil || !res[0].Allowed || res[0].Remaining != 6 || !res[1].Allowed {
		t.Fatalf("composite after the upgrade: %+v, %v", res, err)
	}
	// Composites in batches: 4 callers take 2 each from a fresh key,
	// each take retried with its idempotency key: 8 taken of each
	// counter's 10, none twice.
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 4 {
				res, err := m.Take(ctx, "batched", 1, nil, "charge-"+strconv.Itoa(g*2+i/2))
				if err != nil || !res[0].Allowed || !res[1].Allowed || res[0].Duplicate != (i%2 == 1) {
					t.Errorf("batched composite take %d: %+v, %v", i, res, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if res, err := m.Peek(ctx, "batched", 1, nil); err != nil || res[0].Used != 8 || res[1].Remaining != 2 {
		t.Fatalf("after 8 batched takes: %+v, %v; want 8 used of each", res, err)
	}
	var marker bool
	if err := pool.QueryRow(ctx, `SELECT to_regprocedure($1) IS NOT NULL`,
		`"`+schema+`".ratekit_schema_v`+strconv.Itoa(pgengine.SchemaVersion)+`()`).Scan(&marker); err != nil || !marker {
		t.Fatalf("version marker after the upgrade: %v, %v", marker, err)
	}
}
