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

// The record. A token bucket's state is its debt: the units it lacks to be
// full. The scripts keep it as the key's expiry E, the instant (in Redis's
// milliseconds) at which the bucket is full again, and the key's value w, a
// decimal integer from 0 to rate-1, so that at millisecond t the debt is
// (E-t)×rate - w units, rate being the refill in units per millisecond. This
// is GCRA (ITU-T I.371) with the theoretical arrival time E - w/rate kept
// exactly: a take of n units moves it n/rate ms later, fraction included.
// An absent key is a full bucket, and Redis's expiry deletes the key the
// moment the bucket is full again, so nothing else cleans up.
//
// The clock is the key's own: PTTL gives E-t, which with GET's w is the
// debt, without TIME (whose reply costs Redis as much as a SET) and without
// parsing. A write that continues a debt sets the new expiry absolutely (SET
// … PXAT from PEXPIRETIME), so that a millisecond that ends while the script
// runs cannot shift it: Redis before 7.2 reads a fresh clock for each PTTL
// and each relative expiry, even within one script. A write that starts
// from a full bucket may be relative (PX), since a full bucket is full at
// every instant of the script. It needs Redis 7.0 or later (PEXPIRETIME).
//
// The refill arrives in whole milliseconds of Redis's clock: the level at
// any instant is kvstore.Refill.Level at the start of its millisecond.

// Update is kvstore.Refill.Apply in Lua on the record described above.
// KEYS[1] is the record's key; ARGV is max, rate (units per millisecond: see
// RateArg), n and the op: t (take), p (peek) or r (refund). The reply is one
// integer: the level after the op when n units were available (or
// refunded), and -(level+1) when they were not, so the reply needs no array
// or string parsing. A peek or a refused take calls PTTL and GET and writes
// nothing.
//
// Every number stays below 2^53, where Lua's doubles are exact integers:
// max is at most kvstore.MaxValue (2^52), rate at most max, and the debt
// and what the script computes from it at most max + rate. Lua's % on
// doubles (a - floor(a/b)×b) can land one b below when a/b rounds up to a
// whole number, which the script corrects. The script avoids what costs most
// in Redis's Lua: no pattern matching, no math.* calls, no tonumber on its
// own arguments (arithmetic coerces them), and no number handed to
// redis.call, which Redis formats with printf's %.17g (string.format('%d')
// instead; its arguments are whole numbers, as Lua 5.3 and later require).
const Update = `
local max, rate, n = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0
local k = redis.call('PTTL', KEYS[1])
local d = 0
if k ~= -2 then
  local w = tonumber(redis.call('GET', KEYS[1]))
  if k == -1 or not w then return redis.error_reply('` + Malformed + `') end
  if k > 0 then
    d = (k - 1) * rate + rate - w
    if d > max then d = max elseif d < 0 then d = 0 end
  end
end
local op, v, owed = ARGV[4], max - d, d > 0
if op == 'r' then
  d = d - n
  if d <= 0 then
    if k ~= -2 then redis.call('DEL', KEYS[1]) end
    return max
  end
elseif v < n then
  return -v - 1
elseif op == 't' then
  d = d + n
else
  return v
end
local m = d % rate
if m < 0 then m = m + rate end
local q = (d - m) / rate
if m > 0 then q, m = q + 1, rate - m end
if owed then
  redis.call('SET', KEYS[1], string.format('%d', m), 'PXAT', string.format('%d', redis.call('PEXPIRETIME', KEYS[1]) - k + q))
else
  redis.call('SET', KEYS[1], string.format('%d', m), 'PX', string.format('%d', q))
end
return max - d
`

// Multi is kvstore.MultiAtomic.UpdateMulti in Lua, key by key the
// arithmetic of Update on the same record. KEYS are the records' keys;
// ARGV[1] is the op (t, p or r) and ARGV[3i-1], ARGV[3i], ARGV[3i+1] are key
// i's max, rate (units per millisecond) and n. Every key is read first; a
// take writes only when every key holds its n. The reply is one integer per
// key, in KEYS order, encoded as Update's: the level after the op when key
// i's n units were available (or refunded), and -(level+1) when they were
// not; when a take is refused, a key that held its units reports the level
// it keeps. A key that holds something else fails the call with Malformed
// before anything is written.
const Multi = `
local op = ARGV[1]
local nk = #KEYS
local debt, ttl, all = {}, {}, true
for i = 1, nk do
  local max, rate, n = ARGV[3*i-1] + 0, ARGV[3*i] + 0, ARGV[3*i+1] + 0
  local k = redis.call('PTTL', KEYS[i])
  local d = 0
  if k ~= -2 then
    local w = tonumber(redis.call('GET', KEYS[i]))
    if k == -1 or not w then return redis.error_reply('` + Malformed + `') end
    if k > 0 then
      d = (k - 1) * rate + rate - w
      if d > max then d = max elseif d < 0 then d = 0 end
    end
  end
  debt[i], ttl[i] = d, k
  if max - d < n then all = false end
end
local out = {}
for i = 1, nk do
  local max, rate, n = ARGV[3*i-1] + 0, ARGV[3*i] + 0, ARGV[3*i+1] + 0
  local d, k = debt[i], ttl[i]
  local held, owed = max - d >= n, d > 0
  local write = false
  if op == 'r' then
    d = d - n
    write = true
  elseif op == 't' and all then
    d = d + n
    write = true
  end
  if write then
    if d <= 0 then
      d = 0
      if k ~= -2 then redis.call('DEL', KEYS[i]) end
    else
      local m = d % rate
      if m < 0 then m = m + rate end
      local q = (d - m) / rate
      if m > 0 then q, m = q + 1, rate - m end
      if owed then
        redis.call('SET', KEYS[i], string.format('%d', m), 'PXAT', string.format('%d', redis.call('PEXPIRETIME', KEYS[i]) - k + q))
      else
        redis.call('SET', KEYS[i], string.format('%d', m), 'PX', string.format('%d', q))
      end
    end
  end
  if op ~= 'r' and not held then out[i] = d - max - 1 else out[i] = max - d end
end
return out
`

// RateArg returns the rate argument of Update and Multi for r: r's refill in
// units per millisecond, r.Rate×1000, capped at r.Max (a bucket that refills
// more than its maximum in one millisecond is full at the next one either
// way, and the cap keeps every number of the script below 2^53). r must be
// valid.
func RateArg(r kvstore.Refill) int64 {
	if r.Rate > r.Max/1000 {
		return r.Max
	}
	return r.Rate * 1000
}

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
