// Package redisscript holds what ratekit's Redis stores share: the update
// script that runs kvstore.Refill.Apply on the server, and the record format
// that the script, Get and Set read and write. The stores for go-redis
// (kvstore/redisstore) and rueidis (kvstore/rueidisstore) use it, so that
// both write the same records and either can read the other's keys.
package redisscript

import (
	"strconv"
	"strings"

	"github.com/ratekit/ratekit/kvstore"
)

// Malformed is the message of the error the script returns for a key that
// holds something no ratekit store wrote; the stores turn it into
// kvstore.ErrMalformedRecord.
const Malformed = "kvstore: malformed record"

// Update is kvstore.Refill.Apply in Lua. KEYS[1] is the record's key;
// ARGV is max, rate (units per microsecond), n and the op: t (take), p (peek)
// or r (refund). The record is the string "<value> <time>" (time in
// microseconds since the Unix epoch). The reply is one integer: the level
// after the op when n units were available (or refunded), and -(level+1)
// when they were not, so the reply needs no array or string parsing.
//
// Every number stays below 2^53 (kvstore.MaxValue and the time in
// microseconds), where Lua's doubles are exact integers, except the refill
// v + elapsed*rate of a long-idle key, which is only compared with max (and
// replaced by it): a double that large is far above any max. The script
// avoids what costs most in Redis's Lua: no pattern matching, no math.*
// calls, no tonumber on its own arguments (arithmetic coerces them with one
// string conversion where tonumber makes two; the record is still read with
// tonumber, which returns nil where coercion would raise), and no number
// handed to redis.call, which Redis formats with printf's %.17g (the TTL,
// rounded down to a whole number before the + 1, goes as a
// string.format('%d') string; a whole number also suits Lua 5.3 and later,
// whose %d refuses a fraction). It only uses the string library every
// Redis-compatible server ships.
const Update = `
local max, rate, n = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0
local t = redis.call('TIME')
local clock = t[1] * 1000000 + t[2]
local now, v = clock, max
local s = redis.call('GET', KEYS[1])
if s then
  local i, b = string.find(s, ' ', 1, true)
  if i then v, b = tonumber(string.sub(s, 1, i - 1)), tonumber(string.sub(s, i + 1)) end
  if not (i and v and b) then return redis.error_reply('` + Malformed + `') end
  if v > max then v = max elseif v < 0 then v = 0 end
  if now <= b then
    now = b
  else
    v = v + (now - b) * rate
    if v > max then v = max end
  end
end
local op = ARGV[4]
if op == 'r' then
  v = v + n
  if v > max then v = max end
elseif v < n then
  return -v - 1
elseif op == 't' then
  v = v - n
else
  return v
end
if v >= max then
  redis.call('DEL', KEYS[1])
else
  local ttl = (now - clock + (max - v) / rate) / 1000
  redis.call('SET', KEYS[1], string.format('%d %d', v, now), 'PX', string.format('%d', ttl - ttl % 1 + 1))
end
return v
`

// Multi is kvstore.MultiAtomic.UpdateMulti in Lua, key by key the
// arithmetic of Update. KEYS are the records' keys; ARGV[1] is the op (t, p
// or r) and ARGV[3i-1], ARGV[3i], ARGV[3i+1] are key i's max, rate and n.
// TIME is read once. Every key is read and refilled first; a take writes
// only when every key holds its n. The reply is one integer per key, in
// KEYS order, encoded as Update's: the level after the op when key i's n
// units were available (or refunded), and -(level+1) when they were not;
// when a take is refused, a key that held its units reports the level it
// keeps. A key that holds something else fails the call with Malformed
// before anything is written.
const Multi = `
local t = redis.call('TIME')
local clock = t[1] * 1000000 + t[2]
local op = ARGV[1]
local k = #KEYS
local lv, at, mx, rt, ns, all = {}, {}, {}, {}, {}, true
for i = 1, k do
  local max, rate, n = ARGV[3*i-1] + 0, ARGV[3*i] + 0, ARGV[3*i+1] + 0
  mx[i], rt[i], ns[i] = max, rate, n
  local now, v = clock, max
  local s = redis.call('GET', KEYS[i])
  if s then
    local j, b = string.find(s, ' ', 1, true)
    if j then v, b = tonumber(string.sub(s, 1, j - 1)), tonumber(string.sub(s, j + 1)) end
    if not (j and v and b) then return redis.error_reply('` + Malformed + `') end
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
      redis.call('SET', KEYS[i], string.format('%d %d', v, now), 'PX', string.format('%d', ttl - ttl % 1 + 1))
    end
  end
  if op ~= 'r' and lv[i] < n then out[i] = -v - 1 else out[i] = v end
end
return out
`

// MultiKeys appends to dst the Redis keys of updates in group, in order,
// built in one string so that a call allocates once for all of them: prefix
// + "{" + key + "}" in the empty group (the key of an ordinary Update), and
// otherwise prefix + "g" + kvstore.GroupKey(group, key), whose hash tag
// depends on the group alone, so that a group's keys share a Redis Cluster
// hash slot; the "g" keeps grouped keys apart from the ordinary ones.
func MultiKeys(dst []string, prefix, group string, updates []kvstore.Update) []string {
	// Every key but its own part is the same length: prefix, braces and,
	// in a group, "g", the group's length, ':' and the group.
	fixed := len(prefix) + 2
	if group != "" {
		fixed += 2 + len(group) + decimalLen(len(group))
	}
	total := 0
	for i := range updates {
		total += fixed + len(updates[i].Key)
	}
	var num [20]byte
	glen := strconv.AppendInt(num[:0], int64(len(group)), 10)
	var b strings.Builder
	b.Grow(total)
	for i := range updates {
		b.WriteString(prefix)
		if group == "" {
			b.WriteByte('{')
			b.WriteString(updates[i].Key)
			b.WriteByte('}')
			continue
		}
		b.WriteString("g{")
		b.Write(glen)
		b.WriteByte(':')
		b.WriteString(group)
		b.WriteByte('}')
		b.WriteString(updates[i].Key)
	}
	all, at := b.String(), 0
	for i := range updates {
		end := at + fixed + len(updates[i].Key)
		dst = append(dst, all[at:end])
		at = end
	}
	return dst
}

// Updates records the policies and costs of a multi-key update's updates,
// for a store that caches the script arguments it formatted for them.
type Updates struct {
	refills []kvstore.Refill
	ns      []int64
}

// NewUpdates records the policies and costs of updates.
func NewUpdates(updates []kvstore.Update) Updates {
	u := Updates{refills: make([]kvstore.Refill, len(updates)), ns: make([]int64, len(updates))}
	for i := range updates {
		u.refills[i], u.ns[i] = updates[i].Refill, updates[i].N
	}
	return u
}

// Match reports whether updates have the policies and costs recorded in u,
// in order.
func (u *Updates) Match(updates []kvstore.Update) bool {
	if len(u.ns) != len(updates) {
		return false
	}
	for i := range updates {
		if u.refills[i] != updates[i].Refill || u.ns[i] != updates[i].N {
			return false
		}
	}
	return true
}

// decimalLen returns the number of decimal digits of n >= 0.
func decimalLen(n int) int {
	d := 1
	for ; n >= 10; n /= 10 {
		d++
	}
	return d
}

// Slot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag (the bytes between the first '{' and the first '}' after it, when
// not empty) or of the whole key, modulo 16384.
func Slot(key string) int {
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

// FormatRecord returns rec as the script stores it: "<value> <time>".
func FormatRecord(rec kvstore.Record) string {
	b := make([]byte, 0, 40)
	b = strconv.AppendInt(b, rec.Value, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, rec.Time, 10)
	return string(b)
}

// ParseRecord parses what FormatRecord returns, and reports false for
// anything else.
func ParseRecord(s string) (kvstore.Record, bool) {
	a, b, ok := strings.Cut(s, " ")
	if !ok {
		return kvstore.Record{}, false
	}
	v, err1 := strconv.ParseInt(a, 10, 64)
	t, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil {
		return kvstore.Record{}, false
	}
	return kvstore.Record{Value: v, Time: t}, true
}
