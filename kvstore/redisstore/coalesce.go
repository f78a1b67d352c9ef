package redisstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultMaxInFlight is the bound on a Store's round trips in flight used
// when [Config.MaxInFlight] is zero. With 8, coalescing starts beyond 8
// concurrent decisions: a lower bound makes a handful of callers wait for
// round trips they could have overlapped, while 8 keeps them level with
// separate round trips and still lets many callers share pipelines
// (benchmarks/README.md has the measurements).
const DefaultMaxInFlight = 8

// coalescer sends a Store's commands. A command that finds fewer than max
// round trips in flight goes at once, on its caller's goroutine and context:
// alone, a command waits for nothing. A command that finds max in flight
// joins a queue, and when a round trip ends the whole queue goes to Redis as
// one pipeline, sent by a goroutine that keeps sending while the queue
// keeps filling and ends when it is empty. A pipeline is one write and one
// read on each side for all its commands; under concurrency those system
// calls and wake-ups, not the commands, are most of what Redis and its
// clients spend.
//
// Redis runs each command of a pipeline on its own and in order, as it would
// have run them from separate connections: a script stays atomic, and
// nothing is counted more or less.
type coalescer struct {
	client redis.UniversalClient
	max    int // round trips in flight at most; 0 turns coalescing off

	mu       sync.Mutex
	inflight int       // guarded by mu
	queue    []*waiter // commands waiting for a round trip; guarded by mu
	spare    []*waiter // an empty buffer for the next queue; guarded by mu
}

// A waiter is a queued command. ready receives one value when cmd holds its
// result. A waiter whose caller stopped waiting (its context ended) is sent
// only if a pipeline had already taken it from the queue, and is then never
// reused.
type waiter struct {
	ctx   context.Context
	cmd   redis.Cmder
	ready chan struct{}
}

var waiterPool = sync.Pool{New: func() any { return &waiter{ready: make(chan struct{}, 1)} }}

// do sends cmd and returns cmd's error once cmd holds its result. When ctx
// ends first, do returns ctx.Err() at once; cmd may then still be sent, and
// the caller must not read it.
func (c *coalescer) do(ctx context.Context, cmd redis.Cmder) error {
	if c.max == 0 {
		c.client.Process(ctx, cmd)
		return cmd.Err()
	}
	c.mu.Lock()
	if c.inflight < c.max {
		c.inflight++
		c.mu.Unlock()
		c.client.Process(ctx, cmd)
		c.handOff()
		return cmd.Err()
	}
	w := waiterPool.Get().(*waiter)
	w.ctx, w.cmd = ctx, cmd
	c.queue = append(c.queue, w)
	c.mu.Unlock()
	select {
	case <-w.ready:
		w.ctx, w.cmd = nil, nil
		waiterPool.Put(w)
		return cmd.Err()
	case <-ctx.Done():
	}
	c.mu.Lock()
	if i := slices.Index(c.queue, w); i >= 0 {
		c.queue = slices.Delete(c.queue, i, i+1)
		c.mu.Unlock()
		w.ctx, w.cmd = nil, nil
		waiterPool.Put(w)
		return ctx.Err()
	}
	c.mu.Unlock()
	return ctx.Err()
}

// direct runs f, which makes one round trip, on its caller's goroutine when
// fewer than max round trips are in flight (counting it as one), and
// reports whether it ran. A caller that finds the bound reached sends a
// command through do instead, so that it joins the next pipeline.
func (c *coalescer) direct(f func()) bool {
	if c.max == 0 {
		f()
		return true
	}
	c.mu.Lock()
	if c.inflight >= c.max {
		c.mu.Unlock()
		return false
	}
	c.inflight++
	c.mu.Unlock()
	f()
	c.handOff()
	return true
}

// handOff ends a caller's own round trip: its slot goes to the queued
// commands, if any, sent by a new goroutine, since the caller must return to
// its own caller now.
func (c *coalescer) handOff() {
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.inflight--
		c.mu.Unlock()
		return
	}
	batch := c.queue
	c.queue, c.spare = c.spare, nil
	c.mu.Unlock()
	go c.flush(batch)
}

// flush sends batch as one pipeline and signals its waiters, then does the
// same with what queued meanwhile, until the queue is empty.
func (c *coalescer) flush(batch []*waiter) {
	for {
		c.send(batch)
		for i, w := range batch {
			w.ready <- struct{}{}
			batch[i] = nil
		}
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.inflight--
			c.spare = batch[:0]
			c.mu.Unlock()
			return
		}
		batch, c.queue = c.queue, batch[:0]
		c.mu.Unlock()
	}
}

// send sends the commands of batch whose callers still wait, on a context
// with the values of the first one's context and the latest of their
// deadlines (none when one of them has none): each caller stops waiting at
// its own deadline, and no command is cut short by another caller's.
func (c *coalescer) send(batch []*waiter) {
	var (
		first    context.Context
		deadline time.Time
		bounded  = true
		live     int
	)
	for _, w := range batch {
		if err := w.ctx.Err(); err != nil {
			w.cmd.SetErr(err)
			continue
		}
		live++
		if first == nil {
			first = w.ctx
		}
		if d, ok := w.ctx.Deadline(); !ok {
			bounded = false
		} else if d.After(deadline) {
			deadline = d
		}
	}
	if live == 0 {
		return
	}
	ctx := context.WithoutCancel(first)
	if bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	pipe := c.client.Pipeline()
	for _, w := range batch {
		if w.cmd.Err() == nil {
			pipe.Process(ctx, w.cmd)
		}
	}
	pipe.Exec(ctx) // each command holds its own error
}
