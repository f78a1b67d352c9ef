package faultproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Relay is a plain TCP relay in front of a server whose existing
// connections can be made silent, as a NAT gateway or load balancer leaves
// the flows it dropped without a FIN or RST: data sent on them in either
// direction is discarded, and neither end sees the connection close.
// Connections opened after [Relay.Silence] are relayed normally.
//
// (toxiproxy cannot do this: a toxic applies to every link of a proxy, new
// ones included, and its timeout toxic delivers the held data once it is
// removed.)
type Relay struct {
	// Addr is the relay's loopback host:port, which clients dial.
	Addr string

	t     testing.TB
	ln    net.Listener
	up    string
	mu    sync.Mutex
	links map[*link]struct{}
	done  bool
	wg    sync.WaitGroup

	accepted atomic.Int64
}

type link struct {
	client, server net.Conn
	silent         atomic.Bool
}

// StartRelay starts a relay on a free loopback port in front of upstream
// (host:port). It closes every connection and stops when the test ends.
func StartRelay(t testing.TB, upstream string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{Addr: ln.Addr().String(), t: t, ln: ln, up: upstream, links: map[*link]struct{}{}}
	r.wg.Go(r.accept)
	t.Cleanup(r.Close)
	return r
}

func (r *Relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.up)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, server: s}
		r.mu.Lock()
		if r.done {
			r.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		r.links[l] = struct{}{}
		r.accepted.Add(1)
		r.wg.Go(func() { r.pipe(l, l.server, l.client) })
		r.wg.Go(func() { r.pipe(l, l.client, l.server) })
		r.mu.Unlock()
	}
}

// pipe copies from src to dst until either fails, discarding what it reads
// once l is silent. When a link fails, the relay closes both its ends,
// unless the link is silent: then it closes only the end that failed, so
// that the other end still sees nothing at all.
func (r *Relay) pipe(l *link, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !l.silent.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			src.Close()
			if !l.silent.Load() {
				dst.Close()
			}
			return
		}
	}
}

// Silence makes every connection open now silent for good, and returns how
// many it silenced.
func (r *Relay) Silence() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for l := range r.links {
		l.silent.Store(true)
	}
	return len(r.links)
}

// Accepted returns how many connections the relay has accepted so far.
func (r *Relay) Accepted() int { return int(r.accepted.Load()) }

// Close stops accepting, closes every connection and waits for the relay's
// goroutines. It is safe to call more than once.
func (r *Relay) Close() {
	r.mu.Lock()
	if r.done {
		r.mu.Unlock()
		return
	}
	r.done = true
	r.ln.Close()
	for l := range r.links {
		l.client.Close()
		l.server.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
