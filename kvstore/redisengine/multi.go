package redisengine

import (
	"context"
	"fmt"

	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisengine/internal/redisscript"
)

// CountsPeriods implements kvstore.PeriodCounter: it returns true, since
// UpdateMulti keeps period counters on Redis's clock.
func (e *Engine) CountsPeriods() bool { return true }

// UpdateMulti implements kvstore.MultiAtomic with one EVALSHA of a script
// over every key: the script checks every key (each on its own expiry, as
// Update does), and a take changes the keys only when it applies to all of
// them (it decrements first, as Update does, unless the same keys' last
// take was refused), so Redis runs the whole step atomically. A peek, and
// a take of keys whose last take was refused, read every key first with
// [Conn.Read], as Update does, and run the script only for a take that now
// fits them all.
//
// A call that holds a period counter ([kvstore.Update].Period) runs another
// script, which counts in the period that contains Redis's clock, in whole
// milliseconds; a call of buckets alone reads no clock. A counter's record
// is a hash of one field, "<period start> <period end>", holding the
// count and expiring a minute after the end of its period; a take on the
// record of the period the client's clock is in reads the clock from the
// record's expiry, and any other call reads TIME once.
//
// It returns the errors of [kvstore.CheckMultiPeriods] and
// kvstore.ErrDuplicateKey before contacting Redis, and, on a partitioned
// Conn, a call in the empty group whose keys are in different hash slots
// fails with kvstore.ErrCrossPartition before contacting Redis. A key
// holding something no ratekit store wrote (a bucket's record where a
// counter is asked for, or the reverse, included) gives
// kvstore.ErrMalformedRecord, and Redis's clock outside a counter's bounds
// ratekit.ErrClockSkew; nothing changes then.
func (e *Engine) UpdateMulti(ctx context.Context, group string, op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult) error {
	periods, err := kvstore.CheckMultiPeriods(op, updates, results)
	if err != nil {
		return err
	}
	c := getCall()
	keys := redisscript.MultiKeys(c.keyBuf(len(updates)), &c.text, e.prefix, group, updates)
	if err := e.checkKeys(group, keys, updates); err != nil {
		putCall(c)
		return err
	}
	opArg, hash := "r", uint64(0)
	switch op {
	case kvstore.OpTake:
		opArg, hash = e.refusals.TakeOpKeys(keys)
	case kvstore.OpPeek:
		opArg = "p"
	}
	if periods {
		return e.updatePeriods(ctx, c, opArg, hash, keys, updates, results)
	}
	if opArg == "t" || opArg == "p" {
		// A peek, or a take of keys whose last take was refused: two
		// reads a key decide it, unless the take now fits every key.
		levels, err := e.levels(ctx, c, keys, updates)
		if err != nil {
			return err
		}
		if levels != nil && redisscript.Decided(op, levels, updates, results) {
			putCall(c)
			return nil
		}
	}
	args := redisscript.MultiArgs(c.argBuf(1+3*len(updates)), &c.text, opArg, updates)
	vals, err := e.eval(ctx, multiScript, keys, args, c.intBuf(len(keys)))
	if err != nil {
		return err
	}
	if len(vals) != len(keys) {
		return e.wrap(ctx, "EVALSHA", fmt.Errorf("unexpected reply %v for %d keys", vals, len(keys)))
	}
	admitted := true
	for i, v := range vals {
		results[i] = redisscript.DecodeLevel(v)
		admitted = admitted && v >= 0
	}
	putCall(c)
	e.refusals.Took(opArg, hash, admitted)
	return nil
}

// checkKeys returns kvstore.ErrDuplicateKey when two of keys, the Redis
// keys of updates, are the same, and kvstore.ErrCrossPartition when the
// Conn is partitioned and keys of the empty group are in different hash
// slots.
func (e *Engine) checkKeys(group string, keys []string, updates []kvstore.Update) error {
	for i := 1; i < len(keys); i++ {
		for j := range i {
			if keys[i] == keys[j] {
				return fmt.Errorf("%w: %q", kvstore.ErrDuplicateKey, updates[i].Key)
			}
		}
	}
	if group != "" || len(keys) < 2 || !e.conn.Partitioned() {
		return nil
	}
	slot := redisscript.Slot(keys[0])
	for i := 1; i < len(keys); i++ {
		if redisscript.Slot(keys[i]) != slot {
			return fmt.Errorf("%s: %w: keys %q and %q are in different hash slots; give the call a group", e.name, kvstore.ErrCrossPartition, updates[0].Key, updates[i].Key)
		}
	}
	return nil
}

// updatePeriods runs the period script (redisscript.MultiPeriod) with the
// op argument opArg for a call with period counters over keys, the
// updates' Redis keys; hash is the keys' hash for e.refusals.
func (e *Engine) updatePeriods(ctx context.Context, c *call, opArg string, hash uint64, keys []string, updates []kvstore.Update, results []kvstore.OpResult) error {
	args := redisscript.PeriodArgs(c.argBuf(1+7*len(updates)), &c.text, opArg, updates)
	vals, err := e.eval(ctx, periodScript, keys, args, c.intBuf(redisscript.PeriodReplyLen(updates)))
	if err != nil {
		return err
	}
	if !redisscript.ParsePeriodReply(vals, updates, results) {
		return e.wrap(ctx, "EVALSHA", fmt.Errorf("unexpected reply %v", vals))
	}
	putCall(c)
	admitted := true
	for i := range results {
		admitted = admitted && results[i].OK
	}
	e.refusals.Took(opArg, hash, admitted)
	return nil
}
