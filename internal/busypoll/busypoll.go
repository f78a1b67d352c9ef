// Package busypoll wraps the sockets of a Redis client so that a lone
// caller waits for its reply by polling the socket rather than by sleeping
// until the kernel wakes it.
//
// A caller that reads an empty socket parks its goroutine, and when no
// other goroutine has work the thread under it sleeps too; on a virtual
// machine the processor then halts, and the reply's arrival must wake it
// through the hypervisor, which can take longer than Redis takes to run
// the command. A function instance serving one request at a time is
// exactly that caller, and it is billed for the time it waits, not for
// the processor it uses while waiting.
//
// So a read on a connection that wrote since its last reply polls the
// socket (non-blocking reads, one after another) for up to [Spin] before
// it parks as usual, when no other connection of its [Group] awaits a
// reply: a lone caller. When several callers wait, every read parks: the
// processors are theirs, and Go's scheduler looks for ready sockets only
// when it has nothing else to run, so a poller would hold back the
// others' replies. When the replies keep coming later than Spin (a server
// across a network, or a slow command), polling costs a processor and
// saves nothing, so after [Misses] polls in a row that ended without a
// reply the group parks its next [Rest] reads at once, then tries again.
// A server that runs on the same processors and works long on each
// command (PostgreSQL) loses more to a polling neighbour than the caller
// gains, so only the Redis stores poll.
//
// Deadlines keep their meaning: a poll ends at Spin, and the read that
// follows waits for the deadline as before. A poll allocates nothing. The
// wrapped connection's SyscallConn is the socket's, for health checks
// that peek at it.
package busypoll

import (
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// Spin is the longest a read polls its socket before it parks.
const Spin = 100 * time.Microsecond

// Misses is the number of polls in a row, ended by Spin without a reply,
// after which a group parks its next Rest reads at once.
const Misses = 4

// Rest is the number of reads a group parks at once after Misses polls in
// a row found no reply.
const Rest = 256

// Group is the state that the connections of one client share. The zero
// value is ready; it is safe for concurrent use.
type Group struct {
	awaiting atomic.Int32 // connections that wrote since their last reply
	polling  atomic.Bool  // a connection of the group polls
	misses   atomic.Int32 // polls in a row that ended without a reply
	rest     atomic.Int32 // reads to park at once before polling again
}

// Wrap returns c with its reads polled as the package describes, or c
// itself when it is not a socket (syscall.Conn) or polling is not
// available on this platform.
func (g *Group) Wrap(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok || !supported {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &conn{Conn: c, sys: sc, raw: rc, g: g}
}

// DialTLS dials addr with d, wraps the connection (Wrap) and returns it
// in TLS with config after the handshake, as tls.Dialer does: d.Timeout,
// when set, bounds the dial and the handshake together, and a config
// without ServerName names the host of addr. It closes the connection
// when the handshake fails.
func (g *Group) DialTLS(ctx context.Context, d *net.Dialer, network, addr string, config *tls.Config) (net.Conn, error) {
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if config.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		config = config.Clone()
		config.ServerName = host
	}
	conn = g.Wrap(conn)
	tc := tls.Client(conn, config)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close() // the wrapper's Close, which ends its wait for a reply
		return nil, err
	}
	return tc, nil
}

// enter reports whether a read of a connection that awaits a reply may
// poll: no other connection of the group awaits one, and the group is not
// resting. If so it takes the group's one place to poll.
func (g *Group) enter() bool {
	if g.awaiting.Load() != 1 {
		return false
	}
	if g.rest.Load() > 0 {
		g.rest.Add(-1)
		return false
	}
	return g.polling.CompareAndSwap(false, true)
}

// leave gives the place to poll back, after a poll that found a reply
// (caught) or ran out.
func (g *Group) leave(caught bool) {
	g.polling.Store(false)
	if caught {
		g.misses.Store(0)
		return
	}
	if g.misses.Add(1) >= Misses {
		g.misses.Store(0)
		g.rest.Store(Rest)
	}
}

// conn is a wrapped socket. Its reads and writes may run on different
// goroutines (rueidis reads on one, writes on another).
type conn struct {
	net.Conn
	sys syscall.Conn
	raw syscall.RawConn
	g   *Group
	// sent is true from a write until a read returns data (or the
	// connection closes): a reply is awaited. The group's awaiting counts
	// the connections where it is true.
	sent atomic.Bool
	p    pollState
}

// SyscallConn returns the socket's, so that a health check that peeks at
// the socket (go-redis's) still does.
func (c *conn) SyscallConn() (syscall.RawConn, error) { return c.sys.SyscallConn() }

func (c *conn) Write(b []byte) (int, error) {
	if c.sent.CompareAndSwap(false, true) {
		c.g.awaiting.Add(1)
	}
	return c.Conn.Write(b)
}

func (c *conn) Read(b []byte) (int, error) {
	if len(b) > 0 && c.sent.Load() && c.g.enter() {
		n, caught, err := c.poll(b)
		c.g.leave(caught)
		if caught {
			c.received(n)
			return n, err
		}
	}
	n, err := c.Conn.Read(b)
	c.received(n)
	return n, err
}

// received ends the wait for a reply when a read returned n > 0 bytes.
func (c *conn) received(n int) {
	if n > 0 && c.sent.CompareAndSwap(true, false) {
		c.g.awaiting.Add(-1)
	}
}

func (c *conn) Close() error {
	if c.sent.CompareAndSwap(true, false) {
		c.g.awaiting.Add(-1)
	}
	return c.Conn.Close()
}
