package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/redisstore"
)

func TestSlowRedisFailsWithinDeadlineAndRecovers(t *testing.T) {
	srv := redistest.Start(t)
	proxy := toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), "redis", "127.0.0.1:0", srv.Addr)
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Stop) // runs after the client closes (cleanups run last-in first-out)
	s, _ := redisstore.New(serverlessClient(t, proxy.Listen), redisstore.Config{})
	late := testenv.MeasureLateness(t)
	peekPatiently(t, s, redistest.Take1) // dials and loads the script: not under test
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":2000}}`)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		took, err := redistest.UpdateWithin(s, 100*time.Millisecond)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Update through 2s of latency, deadline 100ms: %v, want context.DeadlineExceeded", err)
		}
		if lateness := late.Max(); took > 100*time.Millisecond+redistest.Slack+lateness {
			t.Fatalf("Update through 2s of latency took %v, deadline 100ms (slack %v, scheduling lateness %v)", took, redistest.Slack, lateness)
		}
		t.Logf("2s latency: error after %v: %v", took, err)
	}
	if err := proxy.Toxics.RemoveToxic(context.Background(), "slow"); err != nil {
		t.Fatal(err)
	}
	t.Logf("latency removed: %d failed attempts before the first success", redistest.Recovers(t, s))
}
