package durable_test

import (
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/testenv"
)

func TestMain(m *testing.M) { pgstoretest.Main(m, testenv.CheckLeaks) }

// farWindow is a window no benchmark outlives.
const farWindow = 10000 * time.Hour

// newLimiter returns a limiter on logged tables, failing b on an error.
func newLimiter(b testing.TB, s *pgstore.Store, alg ratekit.Algorithm, name, prefix string, quota int64, window time.Duration) *durable.Limiter {
	cfg := durable.Config{Store: s, Prefix: prefix, Durability: durable.Logged}
	cfg.Policy = ratekit.Policy{Name: name, Quota: quota, Window: window, Algorithm: alg}
	l, err := durable.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// newStore returns a store on a pool of conns connections to url.
func newStore(b testing.TB, url string, conns int32) *pgstore.Store {
	s, err := pgstore.New(pgstoretest.Pool(b, url, conns, ""), pgstore.Config{Schema: pgstoretest.Schema()})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// newComposite returns the composite of ls, failing b on an error.
func newComposite(b testing.TB, ls ...*durable.Limiter) *durable.Composite {
	c, err := durable.NewComposite(ls...)
	if err != nil {
		b.Fatal(err)
	}
	return c
}
