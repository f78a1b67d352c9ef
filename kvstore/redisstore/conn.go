package redisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/kvstore/redisengine"
)

// conn is a Store seen as the Redis engine's connection: the commands the
// engine sends, on the Store's go-redis client through its coalescer.
type conn Store

// Eval implements [redisengine.Conn] with one command built here rather
// than through redis.Script.Run, which copies the keys and arguments into
// new slices and reads the reply as boxed values. The keys and arguments
// go as pointers to the engine's strings, which go-redis writes as the
// strings and which box nothing, in a pooled argument list; the reply is
// read by the script's type (an IntCmd or an IntSliceCmd), which boxes
// nothing either. A server that lost the script (a flushed cache, a
// failover) answers NOSCRIPT, and the command is sent again with EVAL.
//
// The command goes as a command go-redis never sends again once it may
// have reached Redis, whatever the client's MaxRetries (see scriptCmd):
// when a connection ends after Redis ran a script and before its reply
// arrived, the caller gets the error, and the script has run once.
func (c *conn) Eval(ctx context.Context, script *redisengine.Script, keys, args []string, dst []int64) ([]int64, error) {
	ea := getEvalArgs(3 + len(keys) + len(args))
	cmdArgs := append(ea.args, "evalsha", c.shaArg(script), len(keys))
	for i := range keys {
		cmdArgs = append(cmdArgs, &keys[i])
	}
	for i := range args {
		cmdArgs = append(cmdArgs, &args[i])
	}
	cmd := newScriptCmd(ctx, script.Array(), cmdArgs)
	err := (*Store)(c).do(ctx, cmd.Cmder)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmdArgs[0], cmdArgs[1] = "eval", script.Source()
		cmd = newScriptCmd(ctx, script.Array(), cmdArgs)
		err = (*Store)(c).do(ctx, cmd.Cmder)
	}
	if err != nil {
		// A command whose caller stopped waiting may still be sent: its
		// arguments stay with it, out of the pool.
		return dst, err
	}
	ea.put(cmdArgs)
	return cmd.appendTo(dst), nil
}

// scriptCmd is a script's command: go-redis's IntCmd for a reply of one
// integer (one set), its IntSliceCmd for an array of integers (many
// set), either of which reads the reply without boxing it.
//
// go-redis does not resend the command after a failure once it may have
// been written (redis.Cmder's NoRetry, which the client, a Ring, a
// ClusterClient and their pipelines honour): a script that ran but whose
// reply was lost would otherwise run again, and a take would be charged
// twice for one decision. A command refused before any of it was written
// is still sent again, and a Redis Cluster's MOVED and ASK redirections
// still apply (the script did not run).
type scriptCmd struct {
	redis.Cmder
	one  *redis.IntCmd
	many *redis.IntSliceCmd
}

// newScriptCmd returns a script's command of args, which reads an array of
// integers when array is true and one integer otherwise.
func newScriptCmd(ctx context.Context, array bool, args []any) scriptCmd {
	if array {
		cmd := redis.NewIntSliceCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		return scriptCmd{Cmder: noRetryInts{cmd}, many: cmd}
	}
	cmd := redis.NewIntCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return scriptCmd{Cmder: noRetryInt{cmd}, one: cmd}
}

// appendTo appends the integers of the command's reply to dst.
func (c scriptCmd) appendTo(dst []int64) []int64 {
	if c.many != nil {
		return append(dst, c.many.Val()...)
	}
	return append(dst, c.one.Val())
}

// noRetryInt and noRetryInts are go-redis's integer commands marked as
// never to be sent again once they may have been written (see scriptCmd).
type (
	noRetryInt  struct{ *redis.IntCmd }
	noRetryInts struct{ *redis.IntSliceCmd }
)

// NoRetry reports true: see scriptCmd.
func (noRetryInt) NoRetry() bool { return true }

// NoRetry reports true: see scriptCmd.
func (noRetryInts) NoRetry() bool { return true }

// evalArgs is a pooled argument list of a script's command.
type evalArgs struct{ args []any }

// maxEvalArgs is the capacity beyond which an argument list is not pooled.
const maxEvalArgs = 128

var evalArgsPool = sync.Pool{New: func() any { return &evalArgs{args: make([]any, 0, 32)} }}

// getEvalArgs returns a pooled argument list, empty, with room for n.
func getEvalArgs(n int) *evalArgs {
	ea := evalArgsPool.Get().(*evalArgs)
	if cap(ea.args) < n {
		ea.args = make([]any, 0, n)
	}
	return ea
}

// put returns ea to the pool with args, the list it became, cleared.
func (ea *evalArgs) put(args []any) {
	if cap(args) > maxEvalArgs {
		return
	}
	clear(args)
	ea.args = args[:0]
	evalArgsPool.Put(ea)
}

// shaArg returns the SHA of script as a command's argument, boxed once per
// script and Store: boxing the string at every call would allocate.
func (c *conn) shaArg(script *redisengine.Script) any {
	if v, ok := c.shas.Load(script); ok {
		return v
	}
	v, _ := c.shas.LoadOrStore(script, any(script.SHA()))
	return v
}

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
