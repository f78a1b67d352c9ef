package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/kvstore/redisengine"
)

// conn is a Store seen as the Redis engine's connection: the commands the
// engine sends, on the Store's go-redis client through its coalescer.
type conn Store

// Eval implements [redisengine.Conn] with one command built here rather
// than through redis.Script.Run, which copies the keys and arguments into
// new slices. The keys and arguments go as pointers to the engine's
// strings, which go-redis writes as the strings and which box nothing. A
// server that lost the script (a flushed cache, a failover) answers
// NOSCRIPT, and the command is sent again with EVAL.
//
// The command goes as a scriptCmd, which go-redis never sends again once
// it may have reached Redis, whatever the client's MaxRetries: when a
// connection ends after Redis ran a script and before its reply arrived,
// the caller gets the error, and the script has run once.
func (c *conn) Eval(ctx context.Context, script *redisengine.Script, keys, args []string, dst []int64) ([]int64, error) {
	cmdArgs := make([]any, 3, 3+len(keys)+len(args))
	cmdArgs[0], cmdArgs[1], cmdArgs[2] = "evalsha", script.SHA(), len(keys)
	for i := range keys {
		cmdArgs = append(cmdArgs, &keys[i])
	}
	for i := range args {
		cmdArgs = append(cmdArgs, &args[i])
	}
	cmd := redis.NewCmd(ctx, cmdArgs...)
	cmd.SetFirstKeyPos(3)
	err := (*Store)(c).do(ctx, scriptCmd{cmd})
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmdArgs[0], cmdArgs[1] = "eval", script.Source()
		cmd = redis.NewCmd(ctx, cmdArgs...)
		cmd.SetFirstKeyPos(3)
		err = (*Store)(c).do(ctx, scriptCmd{cmd})
	}
	if err != nil {
		return dst, err
	}
	// The reply read in place: Int64Slice would copy it into a new slice.
	switch v := cmd.Val().(type) {
	case int64:
		return append(dst, v), nil
	case []any:
		for _, e := range v {
			i, ok := e.(int64)
			if !ok {
				return dst, fmt.Errorf("unexpected reply %v", v)
			}
			dst = append(dst, i)
		}
		return dst, nil
	}
	return dst, fmt.Errorf("unexpected reply %v", cmd.Val())
}

// scriptCmd is a script's command that go-redis does not resend after a
// failure once it may have been written (redis.Cmder's NoRetry, which the
// client, a Ring, a ClusterClient and their pipelines honour): a script
// that ran but whose reply was lost would otherwise run again, and a take
// would be charged twice for one decision. A command refused before any of
// it was written is still sent again, and a Redis Cluster's MOVED and ASK
// redirections still apply (the script did not run).
type scriptCmd struct{ *redis.Cmd }

// NoRetry reports true: see scriptCmd.
func (scriptCmd) NoRetry() bool { return true }

// Read implements [redisengine.Conn] with one MULTI/EXEC, when a round
// trip of its own is free (see coalescer.direct): it reports false when
// none is, so that the engine's script joins the next pipeline instead. A
// transaction refused on a connection in doubt before anything was sent
// goes again, as do's commands do.
func (c *conn) Read(ctx context.Context, keys []string, ttls []int64, values []string) (bool, error) {
	cmds := make([]redis.Cmder, 0, 2*len(keys))
	for i := range keys {
		cmds = append(cmds, redis.NewIntCmd(ctx, "pttl", &keys[i]), redis.NewStringCmd(ctx, "get", &keys[i]))
	}
	var err error
	send := func() {
		_, err = c.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
			for _, cmd := range cmds {
				p.Process(ctx, cmd)
			}
			return nil
		})
	}
	for i := 0; ; i++ {
		if !c.co.direct(send) {
			return false, nil
		}
		if !errors.Is(err, errNotSent) || ctx.Err() != nil || i == maxNotSent {
			break
		}
		for _, cmd := range cmds {
			cmd.SetErr(nil)
		}
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		if _, refused := errors.AsType[redis.Error](err); refused {
			return false, nil
		}
		return false, err
	}
	for i := range keys {
		ttls[i], values[i] = cmds[2*i].(*redis.IntCmd).Val(), cmds[2*i+1].(*redis.StringCmd).Val()
	}
	return true, nil
}

// Get implements [redisengine.Conn] with GET.
func (c *conn) Get(ctx context.Context, key string) (string, bool, error) {
	cmd := redis.NewStringCmd(ctx, "get", key)
	err := (*Store)(c).do(ctx, cmd)
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	return cmd.Val(), err == nil, err
}

// Set implements [redisengine.Conn] with SET … PX.
func (c *conn) Set(ctx context.Context, key, value string, ttl time.Duration) error {
	return (*Store)(c).do(ctx, redis.NewStatusCmd(ctx, "set", key, value, "px", ttl.Milliseconds()))
}

// Del implements [redisengine.Conn] with DEL.
func (c *conn) Del(ctx context.Context, key string) error {
	return (*Store)(c).do(ctx, redis.NewIntCmd(ctx, "del", key))
}

// Partitioned implements [redisengine.Conn]: it reports whether the client
// spreads keys over several servers, as anything but a *redis.Client (one
// server or a Sentinel failover group) does.
func (c *conn) Partitioned() bool {
	_, single := c.client.(*redis.Client)
	return !single
}
