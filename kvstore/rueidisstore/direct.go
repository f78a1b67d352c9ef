package rueidisstore

import (
	"context"

	"github.com/redis/rueidis"
)

// A lone command and rueidis's pipelining. rueidis writes and reads a
// command on its caller's goroutine while the command is alone on its
// connection, and hands it to the connection's writer and reader
// goroutines once the connection has seen two commands at once (or a
// command whose context can end without a deadline); the connection then
// stays pipelined for good, and each lone command costs two goroutine
// hand-offs more: a wake-up of the writer, a wake-up of the caller, and
// the system calls behind them. A function instance that once served a
// burst would pay that on every decision after.
//
// So the Store counts its commands in flight. A command that finds none
// other goes on the client's pipelined connections until the Store has
// seen two of its commands in flight at once; after that, a command that
// finds none other goes on a dedicated connection of the client's pool
// (rueidis.Client.Dedicated), which serves one caller at a time and so
// writes and reads on the caller's goroutine: one write and one read, as
// before the burst. Commands that find others in flight go on the
// pipelined connections, where they share writes and reads. At most one
// command is on the dedicated connection at a time (a second finds the
// first in flight), so the Store keeps one dedicated command, not a pool.
//
// The dedicated path needs a context with a deadline (or one that never
// ends, whose Done is nil): rueidis pipelines any connection for a context
// that can end without a deadline, since only its writer and reader can
// stop waiting at that end. It is not taken on a Redis Cluster, whose
// dedicated connections serve the hash slot of their first command. The
// Store sees only its own commands: a client whose connections other code
// pipelined (its own commands at once, or rueidis's keepalive PING meeting
// a command) serves the Store's lone commands pipelined until the Store
// itself sees two at once.

// do sends cmd, on a dedicated connection when the caller is alone and
// the client's connections may be pipelined (see above).
func (c *conn) do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if !c.enter(ctx) {
		defer c.calls.Add(-1)
		return c.client.Do(ctx, cmd)
	}
	d := &c.direct
	d.ctx, d.cmd = ctx, cmd
	c.client.Dedicated(d.send)
	res := d.res
	*d = dedicated{send: d.send}
	c.calls.Add(-1)
	return res
}

// doMulti is do for the commands of cmds, sent together.
func (c *conn) doMulti(ctx context.Context, cmds rueidis.Commands) []rueidis.RedisResult {
	if !c.enter(ctx) {
		defer c.calls.Add(-1)
		return c.client.DoMulti(ctx, cmds...)
	}
	d := &c.direct
	d.ctx, d.multi = ctx, cmds
	c.client.Dedicated(d.send)
	res := d.results
	*d = dedicated{send: d.send}
	c.calls.Add(-1)
	return res
}

// enter counts a command in flight and reports whether it goes on the
// dedicated path: it is alone, the client may have pipelined its
// connections, and ctx allows the client to serve it on the caller's
// goroutine. The caller decrements c.calls when the command is done.
func (c *conn) enter(ctx context.Context) bool {
	n := c.calls.Add(1)
	_, deadline := ctx.Deadline()
	syncable := deadline || ctx.Done() == nil
	if n > 1 || !syncable {
		// rueidis pipelines a connection for this command, or for the
		// one in flight beside it.
		if !c.pipelined.Load() {
			c.pipelined.Store(true)
		}
		return false
	}
	return c.standalone && c.pipelined.Load()
}

// dedicated is the command of a call on a dedicated connection: cmd, or
// the commands of multi when it is not nil, sent with ctx, and its
// replies. send is do bound to it once, so that a call allocates no
// closure.
type dedicated struct {
	ctx     context.Context
	cmd     rueidis.Completed
	multi   rueidis.Commands
	res     rueidis.RedisResult
	results []rueidis.RedisResult
	send    func(rueidis.DedicatedClient) error
}

// do sends d's command on dc, a dedicated connection, and keeps its
// replies in d.
func (d *dedicated) do(dc rueidis.DedicatedClient) error {
	if d.multi != nil {
		d.results = dc.DoMulti(d.ctx, d.multi...)
		return nil
	}
	d.res = dc.Do(d.ctx, d.cmd)
	return nil
}
