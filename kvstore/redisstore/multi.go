package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/internal/redisscript"
	"github.com/ratekit/ratekit/kvstore"
)

var _ kvstore.MultiAtomic = (*Store)(nil)

// Partitioned implements [kvstore.MultiAtomic]: it reports whether the
// client spreads keys over several servers (anything but a *redis.Client,
// which is one server or a Sentinel failover group): a Redis Cluster
// (*redis.ClusterClient) or a *redis.Ring.
func (s *Store) Partitioned() bool {
	_, single := s.client.(*redis.Client)
	return !single
}

// multiKey returns the Redis key of key in group: Key(key) in the empty
// group, and otherwise Prefix + "g" + [kvstore.GroupKey](group, key), whose
// hash tag depends on the group alone, so that a group's keys share a hash
// slot. The "g" keeps grouped keys apart from the ordinary ones, which
// follow the prefix with "{".
func (s *Store) multiKey(group, key string) string {
	if group == "" {
		return s.Key(key)
	}
	return redisscript.MultiKey(s.prefix, group, key)
}

// UpdateMulti implements [kvstore.MultiAtomic] with one EVALSHA of a Lua
// script over every key, coalesced into pipelines as Update is: the script
// reads TIME once, refills and checks every key, and writes only when the
// operation applies to all of them, so Redis runs the whole step atomically.
// A server that answers NOSCRIPT gets the call again with EVAL.
//
// It returns the errors of [kvstore.CheckMulti] and kvstore.ErrDuplicateKey
// before contacting Redis, and, on a partitioned client (see Partitioned), a
// call in the empty group whose keys are in different hash slots fails with
// kvstore.ErrCrossPartition before contacting Redis. A key holding
// something this package did not write gives kvstore.ErrMalformedRecord,
// and nothing changes.
func (s *Store) UpdateMulti(ctx context.Context, group string, op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult) error {
	if err := kvstore.CheckMulti(op, updates, results); err != nil {
		return err
	}
	n := len(updates)
	args := make([]any, 0, 4+n*4)
	args = append(args, "evalsha", multiSHA(), n)
	for i := range updates {
		args = append(args, s.multiKey(group, updates[i].Key))
	}
	keys := args[3 : 3+n]
	for i := 1; i < n; i++ {
		for j := range i {
			if keys[i] == keys[j] {
				return fmt.Errorf("%w: %q", kvstore.ErrDuplicateKey, updates[i].Key)
			}
		}
	}
	if group == "" && n > 1 && s.Partitioned() {
		slot := keySlot(keys[0].(string))
		for i := 1; i < n; i++ {
			if keySlot(keys[i].(string)) != slot {
				return fmt.Errorf("%w: redisstore: keys %q and %q are in different hash slots; give the call a group", kvstore.ErrCrossPartition, updates[0].Key, updates[i].Key)
			}
		}
	}
	switch op {
	case kvstore.OpTake:
		args = append(args, "t")
	case kvstore.OpPeek:
		args = append(args, "p")
	default:
		args = append(args, "r")
	}
	for i := range updates {
		u := &updates[i]
		args = append(args, u.Refill.Max, u.Refill.Rate, u.N)
	}
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	err := s.do(ctx, cmd)
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
	vals, err := cmd.Int64Slice()
	if err != nil || len(vals) != n {
		return wrap(ctx, "EVALSHA", fmt.Errorf("unexpected reply %v: %v", cmd.Val(), err))
	}
	for i, v := range vals {
		if v < 0 {
			results[i] = kvstore.OpResult{OK: false, Value: -v - 1}
		} else {
			results[i] = kvstore.OpResult{OK: true, Value: v}
		}
	}
	return nil
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
