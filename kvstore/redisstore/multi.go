package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/redisscript"
	"github.com/ratekit/ratekit/kvstore"
)

var (
	_ kvstore.MultiAtomic   = (*Store)(nil)
	_ kvstore.PeriodCounter = (*Store)(nil)
)

// CountsPeriods implements [kvstore.PeriodCounter]: it returns true, since
// UpdateMulti keeps period counters on Redis's clock.
func (s *Store) CountsPeriods() bool { return true }

// Partitioned implements [kvstore.MultiAtomic]: it reports whether the
// client spreads keys over several servers (anything but a *redis.Client,
// which is one server or a Sentinel failover group): a Redis Cluster
// (*redis.ClusterClient) or a *redis.Ring.
func (s *Store) Partitioned() bool {
	_, single := s.client.(*redis.Client)
	return !single
}

// UpdateMulti implements [kvstore.MultiAtomic] with one EVALSHA of a Lua
// script over every key, coalesced into pipelines as Update is: the script
// checks every key (each on its own expiry, as Update does), and a take
// changes the keys only when it applies to all of them (it decrements
// first, as Update does, unless the same keys' last take was refused), so
// Redis runs the whole step atomically. A peek, and a take of keys whose
// last take was refused, read every key first in one MULTI/EXEC, as
// Update does, and run the script only for a take that now fits them all.
// A server that answers NOSCRIPT gets the call again with EVAL.
//
// A call that holds a period counter ([kvstore.Update].Period) runs another
// script, which also reads Redis's TIME once (in microseconds) and picks
// each counter's period with it; a call of buckets alone reads no clock.
// A counter's record is one key, "<count> <period start>", expiring a
// minute after the end of its period.
//
// It returns the errors of [kvstore.CheckMultiPeriods] and
// kvstore.ErrDuplicateKey before contacting Redis, and, on a partitioned
// client (see Partitioned), a call in the empty group whose keys are in
// different hash slots fails with kvstore.ErrCrossPartition before
// contacting Redis. A key holding something this package did not write (a
// bucket's record where a counter is asked for, or the reverse, included)
// gives kvstore.ErrMalformedRecord, and Redis's clock outside a counter's
// bounds ratekit.ErrClockSkew; nothing changes then.
func (s *Store) UpdateMulti(ctx context.Context, group string, op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult) error {
	periods, err := kvstore.CheckMultiPeriods(op, updates, results)
	if err != nil {
		return err
	}
	n := len(updates)
	args := make([]any, 3+n, 4+n*4)
	args[0], args[1], args[2] = "evalsha", multiSHA(), n
	var keyBuf [8]string
	keys := redisscript.MultiKeys(keyBuf[:0], s.prefix, group, updates)
	for i, k := range keys {
		args[3+i] = k
	}
	for i := 1; i < n; i++ {
		for j := range i {
			if keys[i] == keys[j] {
				return fmt.Errorf("%w: %q", kvstore.ErrDuplicateKey, updates[i].Key)
			}
		}
	}
	if group == "" && n > 1 && s.Partitioned() {
		slot := keySlot(keys[0])
		for i := 1; i < n; i++ {
			if keySlot(keys[i]) != slot {
				return fmt.Errorf("redisstore: %w: keys %q and %q are in different hash slots; give the call a group", kvstore.ErrCrossPartition, updates[0].Key, updates[i].Key)
			}
		}
	}
	if periods {
		return s.updatePeriods(ctx, op, updates, results, args)
	}
	opArg, hash := "r", uint64(0)
	switch op {
	case kvstore.OpTake:
		opArg, hash = s.refusals.TakeOpKeys(keys)
	case kvstore.OpPeek:
		opArg = "p"
	}
	if opArg == "t" || opArg == "p" {
		// A peek, or a take of keys whose last take was refused: two
		// reads a key decide it, unless the take now fits every key.
		var buf [8]int64
		levels := slices.Grow(buf[:0], n)[:n]
		ok, err := s.levels(ctx, keys, updates, levels)
		if err != nil {
			return err
		}
		if ok && redisscript.Decided(op, levels, updates, results) {
			return nil
		}
	}
	args = append(args, boxedOp(opArg))
	m := s.multiArgs.Load()
	if m == nil || !m.Match(updates) {
		m = newMultiArgs(updates)
		s.multiArgs.Store(m)
	}
	args = append(args, m.args...)
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	err = s.do(ctx, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", multiSource
		cmd = redis.NewCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		err = s.do(ctx, cmd)
	}
	if err != nil {
		if strings.Contains(err.Error(), malformedMsg) {
			return kvstore.ErrMalformedRecord
		}
		return wrap(ctx, "EVALSHA", err)
	}
	// The reply read in place: Int64Slice would copy it into a new slice.
	vals, ok := cmd.Val().([]any)
	if !ok || len(vals) != n {
		return wrap(ctx, "EVALSHA", fmt.Errorf("unexpected reply %v", cmd.Val()))
	}
	admitted := true
	for i, r := range vals {
		v, ok := r.(int64)
		if !ok {
			return wrap(ctx, "EVALSHA", fmt.Errorf("unexpected reply %v", cmd.Val()))
		}
		if v < 0 {
			results[i] = kvstore.OpResult{OK: false, Remaining: -v - 1}
			admitted = false
		} else {
			results[i] = kvstore.OpResult{OK: true, Remaining: v}
		}
	}
	s.refusals.Took(opArg, hash, admitted)
	return nil
}

// updatePeriods runs redisscript.MultiPeriod for a call with period
// counters, whose args hold the command, the number of keys and the keys.
func (s *Store) updatePeriods(ctx context.Context, op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult, args []any) error {
	args[0], args[1] = "evalsha", periodSHA()
	var argBuf [24]string
	for _, a := range redisscript.PeriodArgs(argBuf[:0], op, updates) {
		args = append(args, a)
	}
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	err := s.do(ctx, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", redisscript.MultiPeriod
		cmd = redis.NewCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		err = s.do(ctx, cmd)
	}
	if err != nil {
		switch msg := err.Error(); {
		case strings.Contains(msg, malformedMsg):
			return kvstore.ErrMalformedRecord
		case strings.Contains(msg, redisscript.ClockSkew):
			return fmt.Errorf("redisstore: %w (%s)", ratekit.ErrClockSkew, msg)
		}
		return wrap(ctx, "EVALSHA", err)
	}
	raw, ok := cmd.Val().([]any)
	var valBuf [24]int64
	vals := valBuf[:0]
	for _, r := range raw {
		v, isInt := r.(int64)
		ok = ok && isInt
		vals = append(vals, v)
	}
	if !ok || !redisscript.ParsePeriodReply(vals, updates, results) {
		return wrap(ctx, "EVALSHA", fmt.Errorf("unexpected reply %v", cmd.Val()))
	}
	return nil
}

var (
	periodSHAOnce sync.Once
	periodSHAHex  string
)

// periodSHA returns the SHA-1 of redisscript.MultiPeriod in hex, computed
// on first use.
func periodSHA() string {
	periodSHAOnce.Do(func() { periodSHAHex = redis.NewScript(redisscript.MultiPeriod).Hash() })
	return periodSHAHex
}

// multiArgs caches the script arguments of the last UpdateMulti's updates
// (each one's max, rate and n), boxed once, so that a composite that sends
// the same policies and costs over and over formats and allocates nothing
// for them.
type multiArgs struct {
	redisscript.Updates
	args []any
}

func newMultiArgs(updates []kvstore.Update) *multiArgs {
	m := &multiArgs{Updates: redisscript.NewUpdates(updates), args: make([]any, 0, 3*len(updates))}
	for i := range updates {
		u := &updates[i]
		m.args = append(m.args, u.Refill.Burst, redisscript.RateArg(u.Refill), u.N)
	}
	return m
}

// multiSource is the multi-key update script, redisscript.Multi.
const multiSource = redisscript.Multi

var (
	multiSHAOnce sync.Once
	multiSHAHex  string
)

// multiSHA returns the SHA-1 of multiSource in hex, computed on first use.
func multiSHA() string {
	multiSHAOnce.Do(func() { multiSHAHex = redis.NewScript(multiSource).Hash() })
	return multiSHAHex
}

// keySlot returns the Redis Cluster hash slot of key (redisscript.Slot).
func keySlot(key string) int { return redisscript.Slot(key) }
