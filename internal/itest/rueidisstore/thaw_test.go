package rueidisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit/internal/itest/faultproxy"
	"github.com/ratekit/ratekit/internal/itest/thawtest"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
)

// TestThawWithSilentConnections is an instance thawing after a NAT gateway
// dropped its connections without a FIN or RST: they swallow what they are
// sent and never answer, while new connections work. The client is set up
// with rueidisstore.ServerlessOptions. Decisions made one after another,
// each with a deadline longer than twice the options' timeout, must see at most
// one failure per silenced connection, each within twice the timeout, and then
// succeed; no take may count twice. The connections are in either of
// rueidis's states: writing and reading on the caller's goroutine (only lone
// decisions so far), or pipelined (after a burst). With rueidis's defaults,
// every decision fails for seconds after a burst. Peeks, which the store
// sends as a MULTI/EXEC instead of the script, must recover as takes do.
func TestThawWithSilentConnections(t *testing.T) {
	for _, tc := range []struct {
		name        string
		burst, peek bool
	}{
		{name: "lone decisions"},
		{name: "after a burst", burst: true},
		{name: "lone peeks", peek: true},
		{name: "peeks after a burst", burst: true, peek: true},
	} {
		t.Run(tc.name, func(t *testing.T) { testThaw(t, tc.burst, tc.peek) })
	}
}

// client returns a rueidis client with options o, closed at cleanup.
func client(t *testing.T, o rueidis.ClientOption) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func testThaw(t *testing.T, burst, peek bool) {
	// timeout is each decision's deadline, and command the options' timeout:
	// twice command and a margin, as ServerlessOptions asks. (With no
	// margin, a decision queued behind rueidis's PING on a connection that
	// turned pipelined just before the silence meets its deadline a few
	// milliseconds before the PING's, and the next decision fails on the
	// same connection.)
	const command = 250 * time.Millisecond
	const timeout = 2*command + 100*time.Millisecond
	srv := redistest.Start(t)
	relay := faultproxy.StartRelay(t, srv.Addr)
	c := client(t, *rueidisstore.ServerlessOptions(&rueidis.ClientOption{InitAddress: []string{relay.Addr}, DisableCache: true}, command))
	s, err := rueidisstore.New(c, rueidisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	take := thawtest.Take(s)
	// Lone takes, then (burst) concurrent ones: none may fail before the
	// freeze, so that the takes Redis counts are known.
	fill := func() {
		if err := take(5 * time.Second); err != nil {
			t.Errorf("take before the freeze: %v", err)
		}
	}
	filled := 10
	for range filled {
		fill()
	}
	if burst {
		filled += 16 * 10
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for range 10 {
					fill()
				}
			})
		}
		wg.Wait()
	}
	if t.Failed() {
		t.FailNow()
	}
	time.Sleep(500 * time.Millisecond)
	silenced := relay.Silence()

	decide := func() error { return take(timeout) }
	if peek {
		peek := thawtest.Peek(s)
		decide = func() error { return peek(timeout) }
	}
	log := thawtest.Decide(decide, thawtest.Count(20))
	failed, recovery := thawtest.Read(t, silenced, log)
	if failed > silenced {
		t.Errorf("%d decisions failed after the thaw, want at most %d, one per silenced connection", failed, silenced)
	}
	for i, a := range log {
		// A pipelined connection is found silent by a PING sent after
		// the options' timeout without a reply, and answered within it.
		if d := a.End.Sub(a.Start); a.Err != nil && d > 2*command+redistest.Slack {
			t.Errorf("decision %d failed after %v, want within twice the options' timeout %v", i, d, command)
		}
	}
	if limit := time.Duration(silenced)*2*command + redistest.Slack; recovery > limit {
		t.Errorf("first success %v after the thaw, want within %v", recovery, limit)
	}

	// Exactly the successful takes reached Redis, and a failed one at most
	// once.
	direct := client(t, rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	ds, _ := rueidisstore.New(direct, rueidisstore.Config{})
	rec, err := ds.Update(context.Background(), "k", thawtest.Refill, kvstore.OpPeek, 1)
	if err != nil {
		t.Fatalf("Peek = %+v, %v", rec, err)
	}
	applied := thawtest.Applied(rec.Remaining)
	ok, unsure := int64(filled+len(log)-failed), int64(failed)
	if peek {
		ok, unsure = int64(filled), 0
	}
	if applied < ok || applied > ok+unsure {
		t.Errorf("Redis counted %d takes; %d succeeded and %d failed", applied, ok, unsure)
	}
}
