// Package faultproxy puts an in-process toxiproxy between a test's clients
// and a server (Redis, PostgreSQL, PgBouncer), so that tests can add latency
// and TCP resets on real connections, and offers a plain relay ([Relay])
// whose existing connections can be made silent, as behind a NAT gateway
// that dropped them.
package faultproxy

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy is a running toxiproxy proxy. Its methods fail the test on error and
// must be called from the test's goroutine.
type Proxy struct {
	*toxiproxy.Proxy
	t testing.TB

	once, stopped sync.Once
	done          chan struct{}
	reset         sync.WaitGroup
}

// StrandedToxic is the function in whose stack toxiproxy leaves a
// goroutine for good when a connection is reset while its latency toxic
// holds data: on the interrupt the toxic sends that data to an output that
// no one reads any more (toxiproxy v2.5.0, toxics/latency.go). Tests that
// reset connections under latency pass it to leakcheck.VerifyTestMain, so
// that toxiproxy's goroutines do not read as ratekit's leaks.
const StrandedToxic = "github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"

// Start starts a proxy on a free loopback port in front of upstream
// (host:port) and stops it when the test ends. Clients dial p.Listen.
func Start(t testing.TB, upstream string) *Proxy {
	t.Helper()
	p := toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop()), "faultproxy", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	fp := &Proxy{Proxy: p, t: t, done: make(chan struct{})}
	t.Cleanup(fp.Stop)
	return fp
}

// Latency delays the data in both directions by latency ± jitter
// (milliseconds, toxiproxy's resolution). It replaces an earlier Latency.
func (p *Proxy) Latency(latency, jitter time.Duration) {
	p.t.Helper()
	p.addLatency(latency, jitter, "upstream", "downstream")
}

// ReplyLatency delays the data from the server by latency (milliseconds,
// toxiproxy's resolution), adding latency to every round trip, as a network
// between client and server would. It replaces an earlier Latency.
func (p *Proxy) ReplyLatency(latency time.Duration) {
	p.t.Helper()
	p.addLatency(latency, 0, "downstream")
}

// addLatency replaces the latency toxics with one per stream.
func (p *Proxy) addLatency(latency, jitter time.Duration, streams ...string) {
	p.t.Helper()
	p.RemoveLatency()
	for _, stream := range streams {
		js := fmt.Sprintf(`{"name":"lat-%s","type":"latency","stream":%q,"attributes":{"latency":%d,"jitter":%d}}`,
			stream, stream, latency.Milliseconds(), jitter.Milliseconds())
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			p.t.Fatal(err)
		}
	}
}

// RemoveLatency removes what Latency or ReplyLatency added, if anything.
func (p *Proxy) RemoveLatency() {
	for _, stream := range []string{"upstream", "downstream"} {
		p.Toxics.RemoveToxic(context.Background(), "lat-"+stream) // absent is fine
	}
}

// ResetEvery starts a goroutine that, every period, resets each connection
// that sends data through the proxy (a TCP RST, toxiproxy's reset_peer) for
// the duration of length, until Stop.
func (p *Proxy) ResetEvery(period, length time.Duration) {
	p.reset.Go(func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-tick.C:
			}
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(`{"name":"reset","type":"reset_peer","stream":"upstream","attributes":{"timeout":0}}`)); err != nil {
				p.t.Errorf("add reset_peer: %v", err)
				return
			}
			time.Sleep(length)
			if err := p.Toxics.RemoveToxic(context.Background(), "reset"); err != nil {
				p.t.Errorf("remove reset_peer: %v", err)
				return
			}
		}
	})
}

// Heal stops the resets that ResetEvery started and removes the latency:
// the proxy then passes data through untouched.
func (p *Proxy) Heal() {
	p.once.Do(func() { close(p.done) })
	p.reset.Wait()
	p.RemoveLatency()
}

// Stop heals the proxy and stops it, closing every connection through it.
// It is safe to call more than once.
func (p *Proxy) Stop() {
	p.once.Do(func() { close(p.done) })
	p.reset.Wait()
	// Removing the latency first drains its toxics: stopped with data
	// in flight, a latency toxic's goroutine can stay blocked on a send
	// that nobody receives (goleak reported one in a run under load).
	p.RemoveLatency()
	p.stopped.Do(p.Proxy.Stop)
}
