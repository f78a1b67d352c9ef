// Package redisclient holds the go-redis helpers of ratekit's integration
// tests: a client whose keys are deleted when its test ends, and a hook that
// counts the commands a client sends.
package redisclient

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// CommandCounter is a go-redis hook (client.AddHook) that counts the
// commands a client sends, pipelined ones included.
type CommandCounter struct {
	N         atomic.Int64 // commands
	Pipelined atomic.Int64 // commands sent in pipelines of two or more
}

// DialHook does not count dials.
func (h *CommandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts one command.
func (h *CommandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.N.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts every command of a pipeline.
func (h *CommandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.N.Add(int64(len(cmds)))
		if len(cmds) > 1 {
			h.Pipelined.Add(int64(len(cmds)))
		}
		return next(ctx, cmds)
	}
}

// DeleteAtCleanup deletes every key under prefix from c's server when t
// ends, and then closes c.
func DeleteAtCleanup(t testing.TB, c redis.UniversalClient, prefix string) {
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		c.Close()
	})
}

// Client returns a go-redis client of the Redis at addr that deletes every
// key under prefix and closes when t ends.
func Client(t testing.TB, addr, prefix string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr})
	DeleteAtCleanup(t, c, prefix)
	return c
}
