package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ratekit/ratekit/kvstore/redisstore/internal/busypoll"
	"github.com/ratekit/ratekit/kvstore/redisstore/internal/tcpdial"
)

// A connection that a NAT gateway or load balancer dropped without a FIN or
// RST looks open and answers nothing; go-redis's health check, which peeks
// at the socket, cannot tell it from an idle one. When a frozen function
// instance thaws, every pooled connection may be in that state, and each
// would fail one command at its deadline.
//
// ServerlessOptions' dialer wraps each connection in a watchedConn that
// records when it last received data. When a command sent on a connection
// that had been idle for at least inDoubtIdle gets no reply before its
// deadline, every connection that has received nothing since that command
// was sent is in doubt: it was idle across the same outage. A connection in
// doubt fails go-redis's health check when taken from the pool, so the pool
// discards it and dials a new one; where the health check does not look
// (TLS connections), its first write is refused with errNotSent before
// anything is sent, and the Store sends the command again.

// inDoubtIdle is how long a connection must have been idle before an
// unanswered command on it puts the other idle connections in doubt. A
// timeout on a busy connection (a slow server, a caller's short deadline)
// does not: pgxpool applies the same one-second rule before it pings.
const inDoubtIdle = time.Second

// errNotSent is the error of a write refused on a connection in doubt:
// nothing of the command was sent, so sending it again cannot apply it twice.
var errNotSent = errors.New("redisstore: connection in doubt after an unanswered command on another; nothing sent")

// watch is the state that the connections of one client share.
type watch struct {
	// before is the time (Unix nanoseconds) since which connections that
	// received nothing are in doubt; 0 when none is.
	before atomic.Int64
}

// distrust puts in doubt the connections that have received nothing since t.
func (w *watch) distrust(t int64) {
	for {
		old := w.before.Load()
		if t <= old || w.before.CompareAndSwap(old, t) {
			return
		}
	}
}

// watchedConn is a connection whose silences are watched. go-redis uses a
// connection from one goroutine at a time; its health check runs while the
// connection is idle.
type watchedConn struct {
	net.Conn
	w *watch
	// lastRead is when a read last returned data, or when the connection
	// was dialled (Unix nanoseconds, wall clock: a monotonic clock may not
	// advance while an instance is frozen).
	lastRead atomic.Int64
	// sentAt is when the first write since the last reply began; 0 when
	// nothing was written since.
	sentAt atomic.Int64
}

func (c *watchedConn) inDoubt() bool { return c.lastRead.Load() < c.w.before.Load() }

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.lastRead.Store(time.Now().UnixNano())
		c.sentAt.Store(0)
		return n, err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		if sent := c.sentAt.Load(); sent != 0 && sent-c.lastRead.Load() >= int64(inDoubtIdle) {
			c.w.distrust(sent)
		}
	}
	return n, err
}

func (c *watchedConn) Write(b []byte) (int, error) {
	if c.sentAt.Load() == 0 {
		if c.inDoubt() {
			return 0, errNotSent
		}
		c.sentAt.Store(time.Now().UnixNano())
	}
	return c.Conn.Write(b)
}

// watchedSysConn is a watchedConn over a socket (plain TCP or a Unix
// socket), whose SyscallConn go-redis's health check uses to peek at the
// socket. A connection in doubt fails the check.
type watchedSysConn struct {
	*watchedConn
	sys syscall.Conn
}

func (c watchedSysConn) SyscallConn() (syscall.RawConn, error) {
	if c.inDoubt() {
		return nil, errNotSent
	}
	return c.sys.SyscallConn()
}

// watchedDialer returns a dialer for ServerlessOptions: dial (or, when nil,
// a TCP dial with keepalive, TCP_USER_TIMEOUT and timeout, in TLS when
// tlsConfig is set), with every connection watched.
func watchedDialer(dial func(context.Context, string, string) (net.Conn, error), tlsConfig *tls.Config, timeout time.Duration) func(context.Context, string, string) (net.Conn, error) {
	var poll busypoll.Group
	if dial == nil {
		d := tcpdial.New(timeout)
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if tlsConfig == nil {
				return d.DialContext(ctx, network, addr)
			}
			return poll.DialTLS(ctx, d, network, addr, tlsConfig)
		}
	}
	w := &watch{}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return w.wrap(poll.Wrap(conn)), nil
	}
}

// wrap returns conn watched by w, as received from now on.
func (w *watch) wrap(conn net.Conn) net.Conn {
	c := &watchedConn{Conn: conn, w: w}
	c.lastRead.Store(time.Now().UnixNano())
	if sys, ok := conn.(syscall.Conn); ok {
		return watchedSysConn{c, sys}
	}
	return c
}
