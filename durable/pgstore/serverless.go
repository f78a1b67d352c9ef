package pgstore

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratekit/ratekit/durable/internal/tcpdial"
)

// ServerlessMaxConnIdleTime is the MaxConnIdleTime that
// [ServerlessPoolConfig] sets: one minute.
const ServerlessMaxConnIdleTime = time.Minute

// pingIdle is how long a connection must have been idle before the pool
// pings it on acquire; pgxpool's default ShouldPing uses the same second.
const pingIdle = time.Second

// ServerlessPoolConfig sets cfg for a function instance that may be frozen
// between invocations and must answer within its own deadline, and returns
// cfg. timeout is the longest one decision may take (the Guard's Timeout);
// 0 means 250ms. Use it with a small pool (add default_query_exec_mode=exec
// behind RDS Proxy or PgBouncer, see [New]):
//
//	cfg, err := pgxpool.ParseConfig("postgres://…?pool_max_conns=2")
//	…
//	pool, err := pgxpool.NewWithConfig(ctx, pgstore.ServerlessPoolConfig(cfg, 0))
//
// It sets:
//
//   - PingTimeout: timeout/4. The pool pings a connection idle for more
//     than a second before handing it out; a connection that a NAT gateway
//     or load balancer dropped without a FIN or RST answers nothing, and
//     this bounds what finding that out costs, so that a pool of two can
//     ping both dead connections and still dial a new one within timeout.
//   - ShouldPing: pings a connection idle for more than one second (the
//     default rule) within PingTimeout, and hands the pool only the ones
//     that answer. After a ping got no answer, every connection idle since
//     before that ping started is closed instead of pinged: it sat through
//     the same outage.
//   - BeforeClose: a connection that broke (a failed ping or statement) is
//     closed at once. pgx otherwise drains such a connection for up to 15
//     seconds before the pool frees its slot, and a pool of two whose
//     connections both went silent then has no connection for 15 seconds.
//     cfg's own BeforeClose still runs first.
//   - MaxConnIdleTime: [ServerlessMaxConnIdleTime], below the idle limits
//     after which NAT gateways and load balancers drop a flow (AWS NAT
//     gateway 350 s, Azure load balancer 4 min). The pool retires idle
//     connections in the background, which does not run while the
//     instance is frozen; the ping covers the time after a thaw.
//   - ConnConfig.DialFunc: a TCP dial with keepalive probes after 30 s idle
//     and, on Linux, TCP_USER_TIMEOUT of 15 s, so that a running instance
//     keeps its flows alive and the kernel closes the ones that die under it.
//
// With these settings, after a thaw in which every pooled connection went
// silent, at most one decision fails (none when the pool holds at most two
// connections and timeout leaves time for a new connection after two
// pings) and the next ones run on new connections. Call it once per
// config, before pgxpool.NewWithConfig.
func ServerlessPoolConfig(cfg *pgxpool.Config, timeout time.Duration) *pgxpool.Config {
	if timeout <= 0 {
		timeout = 250 * time.Millisecond
	}
	w := &poolWatch{pingTimeout: timeout / 4}
	cfg.PingTimeout = w.pingTimeout
	cfg.MaxConnIdleTime = ServerlessMaxConnIdleTime
	cfg.ConnConfig.DialFunc = tcpdial.New(0).DialContext
	cfg.ShouldPing = w.shouldPing

	beforeClose := cfg.BeforeClose
	cfg.BeforeClose = func(c *pgx.Conn) {
		if beforeClose != nil {
			beforeClose(c)
		}
		if !c.IsClosed() {
			return // a healthy connection: pgx closes it gracefully
		}
		// pgx's asyncClose drains the broken connection for up to 15
		// seconds, and the pool waits for it; closing the socket ends the
		// drain now.
		c.PgConn().Conn().Close()
	}
	return cfg
}

// poolWatch is what the hooks of one pool share.
type poolWatch struct {
	// before is the time (Unix nanoseconds, wall clock: a monotonic clock
	// may not advance while an instance is frozen) since which idle
	// connections are in doubt; 0 when none is.
	before      atomic.Int64
	pingTimeout time.Duration
}

func (w *poolWatch) distrust(t int64) {
	for {
		old := w.before.Load()
		if t <= old || w.before.CompareAndSwap(old, t) {
			return
		}
	}
}

// shouldPing pings an idle connection itself, so that a ping that gets no
// answer puts the connections idle as long in doubt before the pool takes
// the next one. It returns true, so that the pool pings again and destroys
// the connection, only for a connection that did not answer (closed by
// then, the second ping fails at once) or whose caller's context ended.
func (w *poolWatch) shouldPing(ctx context.Context, p pgxpool.ShouldPingParams) bool {
	if p.IdleDuration <= pingIdle {
		return false
	}
	if ctx.Err() != nil {
		return true
	}
	start := time.Now().UnixNano()
	if start-int64(p.IdleDuration) < w.before.Load() {
		// In doubt: close it (on a dead socket the Terminate message is
		// only buffered), and the pool's ping fails at once.
		p.Conn.Close(ctx)
		return true
	}
	pctx, cancel := context.WithTimeout(ctx, w.pingTimeout)
	err := p.Conn.Ping(pctx)
	cancel()
	if err == nil {
		return false
	}
	if p.Conn.IsClosed() {
		// The ping went out and broke the connection: no answer in time.
		w.distrust(start)
	}
	return true
}
