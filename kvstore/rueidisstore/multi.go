package rueidisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/rueidis"

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
// client is a Redis Cluster client (rueidis.ClientModeCluster), whose keys
// live in hash slots that one script cannot span. A single server and a
// Sentinel group are not partitioned.
func (s *Store) Partitioned() bool {
	return s.client.Mode() == rueidis.ClientModeCluster
}

// multiArgs caches the script arguments of the last UpdateMulti's updates
// (the op, then each one's max, rate and n), formatted once for each op, so
// that a composite that sends the same policies and costs over and over
// formats and allocates nothing for them.
type multiArgs struct {
	redisscript.Updates
	take, read, peek, refund []string // the ops T, t, p and r
}

func newMultiArgs(updates []kvstore.Update) *multiArgs {
	m := &multiArgs{Updates: redisscript.NewUpdates(updates), take: make([]string, 1, 1+3*len(updates))}
	m.take[0] = "T"
	for i := range updates {
		u := &updates[i]
		m.take = append(m.take, strconv.FormatInt(u.Refill.Burst, 10), strconv.FormatInt(redisscript.RateArg(u.Refill), 10), strconv.FormatInt(u.N, 10))
	}
	m.read = append([]string{"t"}, m.take[1:]...)
	m.peek = append([]string{"p"}, m.take[1:]...)
	m.refund = append([]string{"r"}, m.take[1:]...)
	return m
}

var (
	multiSHAOnce sync.Once
	multiSHAHex  string
)

// multiSHA returns the SHA-1 of the multi-key script in hex, computed on
// first use.
func multiSHA() string {
	multiSHAOnce.Do(func() {
		sum := sha1.Sum([]byte(redisscript.Multi))
		multiSHAHex = hex.EncodeToString(sum[:])
	})
	return multiSHAHex
}

// UpdateMulti implements [kvstore.MultiAtomic] with one EVALSHA of the
// multi-key script that kvstore/redisstore runs: it checks every key (each
// on its own expiry, as Update does), and a take changes the keys only when
// it applies to all of them (it decrements first, as Update does, unless
// the same keys' last take was refused), so Redis runs the whole step
// atomically. A peek, and a take of keys whose last take was refused, read
// every key first in one MULTI/EXEC, as Update does, and run the script only
// for a take that now fits them all. A server that answers NOSCRIPT gets
// the call again with EVAL.
//
// A call that holds a period counter ([kvstore.Update].Period) runs
// kvstore/redisstore's period script, which also reads Redis's TIME once
// and picks each counter's period with it; a call of buckets alone reads
// no clock.
//
// It returns the errors of [kvstore.CheckMultiPeriods] and
// kvstore.ErrDuplicateKey before contacting Redis, and, on a Redis Cluster
// client (see Partitioned), a call in the empty group whose keys are in
// different hash slots fails with kvstore.ErrCrossPartition before
// contacting Redis. A key holding something no ratekit store wrote (a
// bucket's record where a counter is asked for, or the reverse, included)
// gives kvstore.ErrMalformedRecord, and Redis's clock outside a counter's
// bounds ratekit.ErrClockSkew; nothing changes then.
func (s *Store) UpdateMulti(ctx context.Context, group string, op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult) error {
	periods, err := kvstore.CheckMultiPeriods(op, updates, results)
	if err != nil {
		return err
	}
	n := len(updates)
	var keyBuf [8]string
	keys := redisscript.MultiKeys(keyBuf[:0], s.prefix, group, updates)
	for i := 1; i < n; i++ {
		for j := range i {
			if keys[i] == keys[j] {
				return fmt.Errorf("%w: %q", kvstore.ErrDuplicateKey, updates[i].Key)
			}
		}
	}
	if group == "" && n > 1 && s.Partitioned() {
		// rueidis's command builder panics on keys of several slots in
		// cluster mode: the check must come first.
		slot := redisscript.Slot(keys[0])
		for i := 1; i < n; i++ {
			if redisscript.Slot(keys[i]) != slot {
				return fmt.Errorf("rueidisstore: %w: keys %q and %q are in different hash slots; give the call a group", kvstore.ErrCrossPartition, updates[0].Key, updates[i].Key)
			}
		}
	}
	if periods {
		return s.updatePeriods(ctx, op, updates, results, keys)
	}
	m := s.multiArgs.Load()
	if m == nil || !m.Match(updates) {
		m = newMultiArgs(updates)
		s.multiArgs.Store(m)
	}
	args, opArg, hash := m.refund, "r", uint64(0)
	switch op {
	case kvstore.OpTake:
		if opArg, hash = s.refusals.TakeOpKeys(keys); opArg == "T" {
			args = m.take
		} else {
			args = m.read
		}
	case kvstore.OpPeek:
		args = m.peek
	}
	if opArg == "t" || op == kvstore.OpPeek {
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
	res := s.client.Do(ctx, s.client.B().Evalsha().Sha1(multiSHA()).Numkeys(int64(n)).Key(keys...).Arg(args...).Build())
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		res = s.client.Do(ctx, s.client.B().Eval().Script(redisscript.Multi).Numkeys(int64(n)).Key(keys...).Arg(args...).Build())
	}
	vals, err := res.AsIntSlice()
	if err != nil {
		if strings.Contains(err.Error(), redisscript.Malformed) {
			return kvstore.ErrMalformedRecord
		}
		return wrap(ctx, "EVALSHA", err)
	}
	if len(vals) != n {
		return wrap(ctx, "EVALSHA", fmt.Errorf("%d results for %d keys", len(vals), n))
	}
	admitted := true
	for i, v := range vals {
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

var (
	periodSHAOnce sync.Once
	periodSHAHex  string
)

// periodSHA returns the SHA-1 of redisscript.MultiPeriod in hex, computed
// on first use.
func periodSHA() string {
	periodSHAOnce.Do(func() {
		sum := sha1.Sum([]byte(redisscript.MultiPeriod))
		periodSHAHex = hex.EncodeToString(sum[:])
	})
	return periodSHAHex
}

// updatePeriods runs redisscript.MultiPeriod for a call with period
// counters over keys, the updates' Redis keys.
func (s *Store) updatePeriods(ctx context.Context, op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult, keys []string) error {
	args := redisscript.PeriodArgs(make([]string, 0, 1+7*len(updates)), op, updates)
	n := int64(len(keys))
	res := s.client.Do(ctx, s.client.B().Evalsha().Sha1(periodSHA()).Numkeys(n).Key(keys...).Arg(args...).Build())
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		res = s.client.Do(ctx, s.client.B().Eval().Script(redisscript.MultiPeriod).Numkeys(n).Key(keys...).Arg(args...).Build())
	}
	vals, err := res.AsIntSlice()
	if err != nil {
		switch msg := err.Error(); {
		case strings.Contains(msg, redisscript.Malformed):
			return kvstore.ErrMalformedRecord
		case strings.Contains(msg, redisscript.ClockSkew):
			return fmt.Errorf("rueidisstore: %w (%s)", ratekit.ErrClockSkew, msg)
		}
		return wrap(ctx, "EVALSHA", err)
	}
	if !redisscript.ParsePeriodReply(vals, updates, results) {
		return wrap(ctx, "EVALSHA", fmt.Errorf("unexpected reply %v", vals))
	}
	return nil
}
