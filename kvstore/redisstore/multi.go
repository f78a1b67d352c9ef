package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

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
	return s.prefix + "g" + kvstore.GroupKey(group, key)
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

// multiSource is kvstore.MultiAtomic.UpdateMulti in Lua, key by key the
// arithmetic of updateSource. KEYS are the records' keys; ARGV[1] is the op
// (t, p or r) and ARGV[3i-1], ARGV[3i], ARGV[3i+1] are key i's max, rate
// and n. TIME is read once. Every key is read and refilled first; a take
// writes only when every key holds its n. The reply is one integer per key,
// in KEYS order, encoded as updateSource's: the level after the op when key
// i's n units were available (or refunded), and -(level+1) when they were
// not; when a take is refused, a key that held its units reports the level
// it keeps.
const multiSource = `
local t = redis.call('TIME')
local clock = t[1] * 1000000 + t[2]
local op = ARGV[1]
local k = #KEYS
local lv, at, mx, rt, ns, all = {}, {}, {}, {}, {}, true
for i = 1, k do
  local max, rate, n = tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i]), tonumber(ARGV[3*i+1])
  mx[i], rt[i], ns[i] = max, rate, n
  local now, v = clock, max
  local s = redis.call('GET', KEYS[i])
  if s then
    local j, b = string.find(s, ' ', 1, true)
    if j then v, b = tonumber(string.sub(s, 1, j - 1)), tonumber(string.sub(s, j + 1)) end
    if not (j and v and b) then return redis.error_reply('` + malformedMsg + `') end
    if v > max then v = max elseif v < 0 then v = 0 end
    if now <= b then
      now = b
    else
      v = v + (now - b) * rate
      if v > max then v = max end
    end
  end
  lv[i], at[i] = v, now
  if v < n then all = false end
end
local out = {}
for i = 1, k do
  local max, rate, n = mx[i], rt[i], ns[i]
  local v, now = lv[i], at[i]
  local write = false
  if op == 'r' then
    v = v + n
    if v > max then v = max end
    write = true
  elseif op == 't' and all then
    v = v - n
    write = true
  end
  if write then
    if v >= max then
      redis.call('DEL', KEYS[i])
    else
      local ttl = (now - clock + (max - v) / rate) / 1000
      redis.call('SET', KEYS[i], string.format('%d %d', v, now), 'PX', ttl - ttl % 1 + 1)
    end
  end
  if op ~= 'r' and lv[i] < n then out[i] = -v - 1 else out[i] = v end
end
return out
`

var (
	multiSHAOnce sync.Once
	multiSHAHex  string
)

// multiSHA returns the SHA-1 of multiSource in hex, computed on first use.
func multiSHA() string {
	multiSHAOnce.Do(func() { multiSHAHex = redis.NewScript(multiSource).Hash() })
	return multiSHAHex
}

// keySlot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag (the bytes between the first '{' and the first '}' after it, when
// not empty) or of the whole key, modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}
