// Package redisscript holds what ratekit's Redis stores share: the update
// script that runs kvstore.Refill.Apply on the server, and the record format
// that the script, Get and Set read and write. The stores for go-redis
// (kvstore/redisstore) and rueidis (kvstore/rueidisstore) use it, so that
// both write the same records and either can read the other's keys.
package redisscript

import (
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/ratekit/ratekit/kvstore"
)

// Malformed is the message of the error the script returns for a key that
// holds something no ratekit store wrote; the stores turn it into
// kvstore.ErrMalformedRecord.
const Malformed = "kvstore: malformed record"

// The record. A token bucket's state is its debt: the units it lacks to be
// full. The scripts keep it in the key's expiry E (in Redis's milliseconds)
// and the key's value w, a whole number of units, so that at millisecond t
// the debt is (E-t)×rate - w, rate being the refill in units per
// millisecond. This is GCRA (ITU-T I.371) with the theoretical arrival time
// E - w/rate kept to the unit, fraction included. The expiry is never
// earlier than the instant the bucket is full again (w >= 0), so an absent
// key is a full bucket, and never later than the time an empty bucket takes
// to fill after the write that set it; a key that outlives its bucket's
// refill reads as full.
//
// The clock is the key's own: PTTL gives E-t, which with GET's w is the
// debt, without TIME (whose reply costs Redis as much as a SET) and without
// parsing more than one integer. Time changes the debt but not w, so while
// the expiry covers the new debt, a take only changes the value: a DECRBY
// of n (an INCRBY when the bucket had refilled to full), which keeps the
// expiry; a refund is an INCRBY. Otherwise the record is rewritten with
// the expiry an empty bucket's fill time away, so that the takes that
// follow change the value only. That write sets the expiry absolutely (SET
// … PXAT from PEXPIRETIME) when the bucket owed units, so that a
// millisecond that ends while the script runs cannot shift the debt: Redis
// before 7.2 reads a fresh clock for each PTTL and each relative expiry,
// even within one script. A bucket that was full may be written relatively
// (PX), since it is full at every instant of the script. It needs Redis 7.0
// or later (PEXPIRETIME).
//
// The refill arrives in whole milliseconds of Redis's clock: the level at
// any instant is kvstore.Refill.Level at the start of its millisecond.
//
// Every number stays below 2^53, where Lua's doubles are exact integers:
// max is at most kvstore.MaxValue (2^52), rate at most max, and the debt,
// the value and what the scripts compute from them at most max + rate.
// Lua's % on doubles (a - floor(a/b)×b) can land one b below when a/b
// rounds up to a whole number, which the scripts correct. They avoid what
// costs most in Redis's Lua: no pattern matching, no math.* calls, no
// tonumber on their own arguments (arithmetic coerces them), and no number
// handed to redis.call, which Redis formats with printf's %.17g (n goes as
// the caller's string, the rest through string.format('%d'), whose
// arguments are whole numbers, as Lua 5.3 and later require).

// bucketLua holds the functions every script runs on a bucket's record.
// bread reads key under max and rate (units per millisecond) and returns
// its PTTL k (-2 for no key), its debt as the record says (raw), the debt
// clamped to [0, max] (d) and its value w; nil for a key that holds
// anything else. bwrite gives the key the debt d2 after a take (take true)
// or a refund of the record read as k, raw and w, n being the units as the
// caller's string. bset rewrites the record with the debt d2 and the expiry
// an empty bucket's fill time away, absolutely when the bucket owed units.
//
// The expiry is within an empty bucket's fill time, ceil(max/rate) ms,
// exactly when (k-1)×rate < max, which needs no division: for whole k >= 1
// and rate >= 1, k <= ceil(x) holds exactly when k-1 < x.
const bucketLua = `
local function bread(key, max, rate)
  local k = redis.call('PTTL', key)
  local raw, d, w = 0, 0, 0
  if k ~= -2 then
    w = tonumber(redis.pcall('GET', key))
    if k == -1 or not w or w < 0 or w >= 9007199254740992 then return nil end
    if k > 0 then raw = k * rate - w end
    d = raw
    if d > max then d = max elseif d < 0 then d = 0 end
  end
  return k, raw, d, w
end
local function bset(key, k, raw, max, rate, d2)
  local m = max % rate
  if m < 0 then m = m + rate end
  local q = (max - m) / rate
  if m > 0 then q = q + 1 end
  if k > 0 and raw > 0 then
    redis.call('SET', key, string.format('%d', q * rate - d2), 'PXAT', string.format('%d', redis.call('PEXPIRETIME', key) - k + q))
  else
    redis.call('SET', key, string.format('%d', q * rate - d2), 'PX', string.format('%d', q))
  end
end
local function bwrite(key, k, raw, w, max, rate, d2, n, take)
  if d2 <= 0 then
    if k ~= -2 then redis.call('DEL', key) end
    return
  end
  if k > 0 and raw <= max and (k - 1) * rate < max then
    if not take then
      redis.call('INCRBY', key, n)
      return
    end
    if k * rate >= d2 then
      if raw >= 0 then
        redis.call('DECRBY', key, n)
      else
        redis.call('INCRBY', key, string.format('%d', k * rate - d2 - w))
      end
      return
    end
  end
  bset(key, k, raw, max, rate, d2)
end
`

// Update is kvstore.Refill.Apply in Lua on the record described above.
// KEYS[1] is the record's key; ARGV is max, rate (units per millisecond: see
// RateArg), n and the op: T or t (take), p (peek) or r (refund). The reply
// is one integer: the level after the op when n units were available (or
// refunded), and -(level+1) when they were not, so the reply needs no array
// or string parsing.
//
// The two takes differ only in what they cost Redis. T decrements first: a
// PTTL and a DECRBY of n, whose reply is the value after the take, decide a
// take the expiry covers, and that DECRBY is the whole write (one INCRBY
// more sets the debt to n when the bucket had refilled to full while its
// key lived); a refused T puts the n units back with an INCRBY. t reads
// first (PTTL and GET) and writes only when it admits, so that a refused
// t, like a peek, writes nothing. Callers send T unless the key's last take
// was refused (see Refusals); the stores decide such a take, and a peek,
// from a MULTI/EXEC of the same two reads first (see Level), and send t
// only when it fits. A take on an absent key writes the record
// at once, as bset would. The functions of bucketLua come after every path
// that needs none of them (takes on new keys, takes the expiry covers,
// refusals and peeks): Lua makes a closure of each function definition it
// runs, on every call.
const Update = `
local key, op = KEYS[1], ARGV[4]
local max, rate, n = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0
local k = redis.call('PTTL', key)
if k == -2 and (op == 'T' or op == 't') and n <= max then
  local m = max % rate
  if m < 0 then m = m + rate end
  local q = (max - m) / rate
  if m > 0 then q = q + 1 end
  redis.call('SET', key, string.format('%d', q * rate - n), 'PX', string.format('%d', q))
  return max - n
end
local raw, d, w, taken = 0, 0, 0, false
if k > 0 then
  if op == 'T' then
    w = redis.pcall('DECRBY', key, ARGV[3])
    if type(w) ~= 'number' then return redis.error_reply('` + Malformed + `') end
    raw = k * rate - w
    if w >= 0 and raw >= n and raw <= max and (k - 1) * rate < max then return max - raw end
    if raw < n and k * rate >= n and (k - 1) * rate < max and w + n < 9007199254740992 then
      redis.call('INCRBY', key, string.format('%d', raw - n))
      return max - n
    end
    w, raw, taken = w + n, raw - n, true
    if w < 0 or w >= 9007199254740992 then
      redis.call('INCRBY', key, ARGV[3])
      return redis.error_reply('` + Malformed + `')
    end
  else
    w = tonumber(redis.pcall('GET', key))
    if not w or w < 0 or w >= 9007199254740992 then return redis.error_reply('` + Malformed + `') end
    raw = k * rate - w
  end
  d = raw
  if d > max then d = max elseif d < 0 then d = 0 end
elseif k == -1 then
  return redis.error_reply('` + Malformed + `')
end
local v, d2 = max - d, d + n
if op ~= 'r' then
  if v < n then
    if taken then redis.call('INCRBY', key, ARGV[3]) end
    return -v - 1
  elseif op == 'p' then
    return v
  end
  if k > 0 and raw <= max and (k - 1) * rate < max and k * rate >= d2 then
    local t = k * rate - d2 - w
    if taken then t = t + n end
    if t == -n then
      redis.call('DECRBY', key, ARGV[3])
    elseif t ~= 0 then
      redis.call('INCRBY', key, string.format('%d', t))
    end
    return v - n
  end
end
` + bucketLua + `
if op == 'r' then
  bwrite(key, k, raw, w, max, rate, d - n, ARGV[3], false)
  if d <= n then return max end
  return v + n
end
bset(key, k, raw, max, rate, d2)
return v - n
`

// Level is what Update's reads (PTTL, then GET) say of a bucket's record, in
// Go: the level at Redis's millisecond of a bucket of max and rate (units
// per millisecond: see RateArg) whose key had the PTTL k and the value w
// (GET's reply, read in the same transaction). A refusal or a peek decided
// on it is the one Update's t or p would return from the same two replies,
// so that a store can decide those with a MULTI/EXEC of two reads, which
// costs Redis a fraction of a script. Level reports false for what it
// leaves to the script: a record Update would refuse as Malformed, and any
// value but a decimal integer in [0, 2^53).
func Level(max, rate, k int64, w string) (int64, bool) {
	switch {
	case k == -2 || k == 0:
		// No key, or one that expires within this millisecond: Update
		// reads a full bucket.
		return max, true
	case k < 0:
		return 0, false
	}
	v, err := strconv.ParseInt(w, 10, 64)
	if err != nil || v < 0 || v >= 1<<53 {
		return 0, false
	}
	// The debt k×rate - v, clamped to [0, max]. k×rate exceeds max + v,
	// and may overflow, exactly when k > (max+v)/rate: the bucket is empty.
	if k > (max+v)/rate {
		return 0, true
	}
	d := k*rate - v
	if d <= 0 {
		return max, true
	}
	return max - min(d, max), true
}

// Decided reports whether levels, the levels of the updates' buckets in
// order as Level reads them, decide a call of op without the script: a
// peek, or a take that does not fit every bucket (which writes nothing). It
// then writes the call's results, as Update and Multi would: each bucket's
// level, and whether its N fits. A refund is never decided.
func Decided(op kvstore.Op, levels []int64, updates []kvstore.Update, results []kvstore.OpResult) bool {
	switch op {
	case kvstore.OpTake:
		if fitAll(levels, updates) {
			return false
		}
	case kvstore.OpPeek:
	default:
		return false
	}
	for i, level := range levels {
		results[i] = kvstore.OpResult{OK: level >= updates[i].N, Remaining: level}
	}
	return true
}

// fitAll reports whether each update's N fits in levels, the levels of
// their buckets in order.
func fitAll(levels []int64, updates []kvstore.Update) bool {
	for i, level := range levels {
		if level < updates[i].N {
			return false
		}
	}
	return true
}

// Multi is kvstore.MultiAtomic.UpdateMulti in Lua, key by key the
// arithmetic of Update on the same record. KEYS are the records' keys;
// ARGV[1] is the op (T or t: take, p or r) and ARGV[3i-1], ARGV[3i],
// ARGV[3i+1] are key i's max, rate (units per millisecond) and n. A take
// writes only when every key holds its n. The reply is one integer per key,
// in KEYS order, encoded as Update's: the level after the op when key i's n
// units were available (or refunded), and -(level+1) when they were not;
// when a take is refused, a key that held its units reports the level it
// keeps. A key that holds something else fails the call with Malformed, and
// leaves every key as it was.
//
// The takes differ as Update's do. T decrements each key first, as Update's
// T does, and when each key's DECRBY reply shows the take admitted and its
// expiry covering it, the take is done (with Update's one INCRBY more for a
// key that had refilled to full). Otherwise it puts back what it took and
// goes on as t, which reads every key first and writes only when the take
// applies to all of them; a refused T costs two commands a key more than a
// t. Callers send T unless the keys' last take was refused (see Refusals).
const Multi = `
local op, nk = ARGV[1], #KEYS
if op == 'T' then
  local out, fix, done = {}, nil, 0
  for i = 1, nk do
    local k = redis.call('PTTL', KEYS[i])
    if k <= 0 then break end
    local w = redis.pcall('DECRBY', KEYS[i], ARGV[3*i+1])
    if type(w) ~= 'number' then break end
    local max, rate, n = ARGV[3*i-1] + 0, ARGV[3*i] + 0, ARGV[3*i+1] + 0
    local raw = k * rate - w
    if w >= 0 and raw >= n and raw <= max and (k - 1) * rate < max then
      out[i] = max - raw
    elseif raw < n and k * rate >= n and (k - 1) * rate < max and w + n < 9007199254740992 then
      out[i] = max - n
      fix = fix or {}
      fix[i] = raw - n
    else
      redis.call('INCRBY', KEYS[i], ARGV[3*i+1])
      break
    end
    done = i
  end
  if done == nk then
    if fix then
      for i, f in pairs(fix) do redis.call('INCRBY', KEYS[i], string.format('%d', f)) end
    end
    return out
  end
  for i = 1, done do redis.call('INCRBY', KEYS[i], ARGV[3*i+1]) end
  op = 't'
end
` + bucketLua + `
local ks, raws, debt, ws, all = {}, {}, {}, {}, true
for i = 1, nk do
  local max, rate, n = ARGV[3*i-1] + 0, ARGV[3*i] + 0, ARGV[3*i+1] + 0
  local k, raw, d, w = bread(KEYS[i], max, rate)
  if not k then return redis.error_reply('` + Malformed + `') end
  ks[i], raws[i], debt[i], ws[i] = k, raw, d, w
  if max - d < n then all = false end
end
local out = {}
for i = 1, nk do
  local max, rate, n = ARGV[3*i-1] + 0, ARGV[3*i] + 0, ARGV[3*i+1] + 0
  local d = debt[i]
  if op == 'r' then
    bwrite(KEYS[i], ks[i], raws[i], ws[i], max, rate, d - n, ARGV[3*i+1], false)
    d = d - n
    if d < 0 then d = 0 end
    out[i] = max - d
  elseif max - d < n then
    out[i] = d - max - 1
  else
    if op == 't' and all then
      bwrite(KEYS[i], ks[i], raws[i], ws[i], max, rate, d + n, ARGV[3*i+1], true)
      d = d + n
    end
    out[i] = max - d
  end
end
return out
`

// ClockSkew is the message of the error MultiPeriod returns when Redis's
// clock is outside a period counter's bounds; the stores turn it into
// ratekit.ErrClockSkew.
const ClockSkew = "kvstore: clock skew"

// MultiPeriod is kvstore.PeriodCounter's UpdateMulti in Lua: Multi's token
// buckets, with the same arithmetic on the same records, and period
// counters (kvstore.PeriodBounds.Apply), decided together on one reading
// of Redis's TIME, in microseconds. The stores run it only for calls that
// hold a period counter, so that Multi, and calls of buckets alone, read no
// clock.
//
// ARGV[1] is the op (t, p or r); then, key by key in KEYS order, a bucket
// is "b", max, rate (units per millisecond), n, and a period counter is
// "p", b0, b1, b2, b3 (microseconds since the epoch), quota, n. A period
// counter's record is "<count> <period start µs>" (FormatRecord's form:
// Value the count, Time the start), written with its expiry at the end of
// the period picked plus a minute, never shortened; a refund to zero
// deletes it. The record's start decides which period it counts (an ended
// period's record counts zero), so the minute changes no decision: it keeps
// the record from expiring within a script that read TIME just before the
// period's end, since Redis before 7.2 checks expiry against a fresh
// clock. Every key is read, and the clock checked against every
// counter's bounds, before anything is written: a clock outside a
// counter's [b0, b3) fails the call with ClockSkew, a record of the other
// kind (or anything else) with Malformed.
//
// The reply is an array: TIME in microseconds, then, key by key, one
// integer for a bucket, encoded as Multi's, and two for a period counter:
// the count after the op (before it, for a take that was refused) and the
// period picked (1, 2 or 3), negated when n units did not fit. Counts and
// quotas are at most kvstore.MaxValue and bounds at most
// kvstore.MaxPeriodBound, so every number is exact in Lua's doubles.
const MultiPeriod = bucketLua + `
local op = ARGV[1]
local nk = #KEYS
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local at, debt, raws, ws, ttl, used, kept, pick, all = {}, {}, {}, {}, {}, {}, {}, {}, true
local j = 2
for i = 1, nk do
  at[i] = j
  if ARGV[j] == 'b' then
    local max, rate, n = ARGV[j+1] + 0, ARGV[j+2] + 0, ARGV[j+3] + 0
    local k, raw, d, w = bread(KEYS[i], max, rate)
    if not k then return redis.error_reply('` + Malformed + `') end
    debt[i], raws[i], ws[i], ttl[i] = d, raw, w, k
    if max - d < n then all = false end
    j = j + 4
  else
    local b0, b1, b2, b3, quota, n = ARGV[j+1] + 0, ARGV[j+2] + 0, ARGV[j+3] + 0, ARGV[j+4] + 0, ARGV[j+5] + 0, ARGV[j+6] + 0
    local p, ws
    if now >= b0 and now < b1 then p, ws = 1, b0
    elseif now >= b1 and now < b2 then p, ws = 2, b1
    elseif now >= b2 and now < b3 then p, ws = 3, b2
    else return redis.error_reply('` + ClockSkew + `: Redis TIME ' .. string.format('%d', now) .. ' us is outside [' .. ARGV[j+1] .. ', ' .. ARGV[j+4] .. ')') end
    local c, s, live = 0, ws, false
    local v = redis.call('GET', KEYS[i])
    if v then
      local sp, rc, rs = string.find(v, ' ', 1, true), nil, nil
      if sp then rc, rs = tonumber(string.sub(v, 1, sp - 1)), tonumber(string.sub(v, sp + 1)) end
      if not rc or not rs then return redis.error_reply('` + Malformed + `') end
      if rs >= ws then
        c, s, live = rc, rs, true
        if c < 0 then c = 0 end
      end
    end
    used[i], kept[i], pick[i], ttl[i] = c, s, p, live
    if c + n > quota then all = false end
    j = j + 7
  end
end
local out = {now}
for i = 1, nk do
  j = at[i]
  if ARGV[j] == 'b' then
    local max, rate, n = ARGV[j+1] + 0, ARGV[j+2] + 0, ARGV[j+3] + 0
    local d, raw, w, k = debt[i], raws[i], ws[i], ttl[i]
    local held = max - d >= n
    if op == 'r' then
      bwrite(KEYS[i], k, raw, w, max, rate, d - n, ARGV[j+3], false)
      d = d - n
      if d < 0 then d = 0 end
    elseif op == 't' and all then
      bwrite(KEYS[i], k, raw, w, max, rate, d + n, ARGV[j+3], true)
      d = d + n
    end
    if op ~= 'r' and not held then out[#out+1] = d - max - 1 else out[#out+1] = max - d end
  else
    local quota, n, p = ARGV[j+5] + 0, ARGV[j+6] + 0, pick[i]
    local c = used[i]
    local held = c + n <= quota
    local write = false
    if op == 't' and all then
      c = c + n
      write = true
    elseif op == 'r' and c > 0 then
      c = c - n
      if c < 0 then c = 0 end
      write = true
    end
    if write then
      if c == 0 then
        redis.call('DEL', KEYS[i])
      else
        local e = ARGV[j+1+p] + 999
        e = (e - e % 1000) / 1000 + 60000
        local rec = string.format('%d', c) .. ' ' .. string.format('%d', kept[i])
        if ttl[i] then
          redis.call('SET', KEYS[i], rec, 'KEEPTTL')
          redis.call('PEXPIREAT', KEYS[i], string.format('%d', e), 'GT')
        else
          redis.call('SET', KEYS[i], rec, 'PXAT', string.format('%d', e))
        end
      end
    end
    out[#out+1] = c
    if op ~= 'r' and not held then out[#out+1] = -p else out[#out+1] = p end
  end
end
return out
`

// Refusals picks the op argument of the takes of Update and Multi: t (read
// first) for a key, or a set of keys taken together, whose last take
// through it was refused, T (decrement first) otherwise, so that keys being
// admitted cost Redis two commands a key and keys being refused two reads
// a key (which the stores send without a script: see Level). It
// remembers a hash of the key or keys in one of a fixed number of slots:
// takes that share a slot only cost a command or two more, never change a
// decision. The zero value is ready; it is safe for concurrent use.
type Refusals struct {
	slots [refusalSlots]atomic.Uint64
}

// refusalSlots is the number of keys Refusals tells apart at once.
const refusalSlots = 256

// FNV-1a (64 bits), the hash of the keys Refusals remembers.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// TakeOp returns the op argument of a take of key and the key's hash, to
// hand to Took with the take's outcome.
func (r *Refusals) TakeOp(key string) (op string, h uint64) {
	h = fnvOffset
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * fnvPrime
	}
	return r.pick(h)
}

// TakeOpKeys is TakeOp for a take of keys together (Multi's): what counts
// is the last take of the same keys in the same order.
func (r *Refusals) TakeOpKeys(keys []string) (op string, h uint64) {
	h = fnvOffset
	for _, k := range keys {
		for i := 0; i < len(k); i++ {
			h = (h ^ uint64(k[i])) * fnvPrime
		}
		// The length ends each key, so that no two lists of keys hash
		// as their concatenation does.
		h = (h ^ uint64(len(k))) * fnvPrime
	}
	return r.pick(h)
}

// pick returns the op argument for the hash h, with its low bit set so that
// nothing hashes to an empty slot.
func (r *Refusals) pick(h uint64) (string, uint64) {
	h |= 1
	if r.slots[h%refusalSlots].Load() == h {
		return "t", h
	}
	return "T", h
}

// OpArg returns Update's op argument for op on key, and the hash to hand
// to Took with the outcome: TakeOp's for a take, p and r otherwise.
func (r *Refusals) OpArg(op kvstore.Op, key string) (arg string, h uint64) {
	switch op {
	case kvstore.OpTake:
		return r.TakeOp(key)
	case kvstore.OpPeek:
		return "p", 0
	}
	return "r", 0
}

// Took records the outcome of an update sent with the op argument op for
// the key of hash h; it ignores every op but a take's.
func (r *Refusals) Took(op string, h uint64, admitted bool) {
	slot := &r.slots[h%refusalSlots]
	switch {
	case !admitted && op == "T":
		slot.Store(h)
	case admitted && op == "t":
		slot.CompareAndSwap(h, 0)
	}
}

// RateArg returns the rate argument of Update and Multi for r: r's refill in
// units per millisecond, r.Rate×1000, capped at r.Burst (a bucket that refills
// more than its maximum in one millisecond is full at the next one either
// way, and the cap keeps every number of the script below 2^53). r must be
// valid.
func RateArg(r kvstore.Refill) int64 {
	if r.Rate > r.Burst/1000 {
		return r.Burst
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

// PeriodArgs appends to dst the ARGV of MultiPeriod for op and updates,
// which must have passed kvstore.CheckMultiPeriods.
func PeriodArgs(dst []string, op kvstore.Op, updates []kvstore.Update) []string {
	switch op {
	case kvstore.OpTake:
		dst = append(dst, "t")
	case kvstore.OpPeek:
		dst = append(dst, "p")
	default:
		dst = append(dst, "r")
	}
	for i := range updates {
		u := &updates[i]
		if p := u.Period; p != nil {
			dst = append(dst, "p",
				strconv.FormatInt(p.Bounds[0], 10), strconv.FormatInt(p.Bounds[1], 10),
				strconv.FormatInt(p.Bounds[2], 10), strconv.FormatInt(p.Bounds[3], 10),
				strconv.FormatInt(p.Quota, 10), strconv.FormatInt(u.N, 10))
			continue
		}
		dst = append(dst, "b", strconv.FormatInt(u.Refill.Burst, 10), strconv.FormatInt(RateArg(u.Refill), 10), strconv.FormatInt(u.N, 10))
	}
	return dst
}

// PeriodReplyLen returns the length of MultiPeriod's reply for updates.
func PeriodReplyLen(updates []kvstore.Update) int {
	n := 1 + len(updates)
	for i := range updates {
		if updates[i].Period != nil {
			n++
		}
	}
	return n
}

// ParsePeriodReply writes into results what MultiPeriod's reply vals says
// of updates, and reports false when vals is not such a reply.
func ParsePeriodReply(vals []int64, updates []kvstore.Update, results []kvstore.OpResult) bool {
	if len(vals) != PeriodReplyLen(updates) {
		return false
	}
	now, j := vals[0], 1
	for i := range updates {
		v := vals[j]
		j++
		p := updates[i].Period
		if p == nil {
			if v < 0 {
				results[i] = kvstore.OpResult{OK: false, Remaining: -v - 1}
			} else {
				results[i] = kvstore.OpResult{OK: true, Remaining: v}
			}
			continue
		}
		pick := vals[j]
		j++
		r := kvstore.OpResult{OK: pick > 0, Used: v, Now: now, Period: int(pick)}
		if pick < 0 {
			r.Period = int(-pick)
		}
		if r.Period < 1 || r.Period > 3 || v < 0 {
			return false
		}
		r.Remaining = max(p.Quota-v, 0)
		results[i] = r
	}
	return true
}
