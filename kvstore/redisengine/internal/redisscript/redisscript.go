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
// and the key's value, a whole number of units, so that at millisecond t
// the debt is (E-t)×rate - value, rate being the refill in units per
// millisecond. This is GCRA (ITU-T I.371): the theoretical arrival time
// tat is E - value/rate, kept to the unit, fraction included, and the debt
// is (tat-t)×rate. The expiry is never earlier than the instant the bucket
// is full again (value >= 0), so an absent key is a full bucket, and never
// later than the time an empty bucket takes to fill after the write that
// set it; a key that outlives its bucket's refill reads as full.
//
// The clock is the key's own: PTTL gives E-t, which with GET's value is
// the debt, without TIME (whose reply costs Redis as much as a SET) and
// without parsing more than one integer. Time changes the debt but not the
// value, so while the expiry covers the new debt, a take only changes the
// value: a DECRBY of n (an INCRBY when the bucket had refilled to full),
// which keeps the expiry; a refund is an INCRBY. Otherwise the record is
// rewritten with the expiry an empty bucket's fill time away, so that the
// takes that follow change the value only. That write sets the expiry
// absolutely (SET … PXAT from PEXPIRETIME) when the bucket owed units, so
// that a millisecond that ends while the script runs cannot shift the
// debt: Redis before 7.2 reads a fresh clock for each PTTL and each
// relative expiry, even within one script. A bucket that was full may be
// written relatively (PX), since it is full at every instant of the
// script. It needs Redis 7.0 or later (PEXPIRETIME).
//
// The refill arrives in whole milliseconds of Redis's clock: the level at
// any instant is kvstore.Refill.Level at the start of its millisecond.
//
// The scripts' locals carry the names of GCRA as go-redis/redis_rate's
// script has them, in units rather than seconds:
//
//   - max, rate, n: the bucket's size (redis_rate's burst), its refill in
//     units per millisecond (the inverse of redis_rate's
//     emission_interval) and the units of the op (its cost); n_arg is n
//     as the caller's string.
//   - ttl, value: the key's PTTL (E-t; -2 for no key) and its value.
//   - raw_debt: the debt the record says, (tat-t)×rate, below 0 when tat
//     has passed; debt: raw_debt clamped to [0, max]; new_debt: the debt
//     after the op, (new_tat-t)×rate.
//   - level: max - debt, the units the bucket holds, which after a take is
//     redis_rate's remaining; a take fits when n <= level, redis_rate's
//     allow_at (new_tat - burst_offset) <= t.
//   - burst_offset: the whole milliseconds an empty bucket takes to fill,
//     ceil(max/rate), the expiry of a rewritten record.
//   - delta: what the key's value must change by for the record to say
//     new_debt.
//
// Each step is written once, in the Lua fragments below, and the scripts
// are put together from them as text rather than as Lua functions: Redis's
// Lua (5.1) makes a new closure of each function definition every time a
// script runs, and the decrement-first take, the path most calls take, is
// little more than a PTTL and a DECRBY, so that a closure or two would
// cost it more than its own arithmetic does.
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

// bucketArgsLua sets the locals max, rate, n_arg and n from a bucket's
// three arguments, which start at ARGV[at].
const bucketArgsLua = `
local max, rate, n_arg = ARGV[at] + 0, ARGV[at + 1] + 0, ARGV[at + 2]
local n = n_arg + 0
`

// recordValueLua is the condition that value (a number, or nil for what is
// not a record) is one a bucket's record holds: at least 0 and below 2^53.
const recordValueLua = `value and value >= 0 and value < 9007199254740992`

// getValueLua reads key's value with GET and sets value to the number it
// is when it is a bucket record's value, and to nil otherwise. A record's
// value is what the scripts write: a decimal integer, digits alone with no
// leading zero (no sign, space, fraction, exponent or hex, which Lua's
// tonumber would take), at least 0 and below 2^53; string.format('%d')
// gives such a value back as it was, and nothing else. It is the rule of
// Level in Go, and the one Redis's own DECRBY applies to the decrement-first
// take (which then checks the range), so that every path reads a key
// alike. It runs only where a script reads before it writes.
const getValueLua = `
local raw = redis.pcall('GET', key)
value = tonumber(raw)
if value and not (` + recordValueLua + ` and value % 1 == 0 and string.format('%d', value) == raw) then value = nil end
`

// debtLua sets raw_debt and debt from the record read as ttl (>= 0) and
// value. A key that expires within this millisecond (ttl 0) has no debt.
const debtLua = `
raw_debt = ttl * rate - value
debt = raw_debt
if debt > max then debt = max elseif debt < 0 then debt = 0 end
`

// readBucketLua reads the record of a bucket of Multi and MultiPeriod, key
// i under the locals key, max, rate and n, and keeps what the writes need
// in the tables ttls, raw_debts, debts and values; all_fit becomes false
// when the bucket does not hold n. A key that holds anything but such a
// record fails the script with Malformed before anything is written.
const readBucketLua = `
local ttl = redis.call('PTTL', key)
local raw_debt, debt, value = 0, 0, 0
if ttl ~= -2 then
` + getValueLua + `
  if ttl == -1 or not (` + recordValueLua + `) then return redis.error_reply('` + Malformed + `') end
` + debtLua + `
end
ttls[i], raw_debts[i], debts[i], values[i] = ttl, raw_debt, debt, value
if max - debt < n then all_fit = false end
`

// decrementedLua and refilledLua are the decrement-first take's two ways
// to be done after its DECRBY of n, conditions on ttl (> 0), value (the
// key's value after the DECRBY) and new_debt, ttl×rate - value. Either
// needs the key to expire within an empty bucket's fill time.
// decrementedLua: the DECRBY alone was the take, which fits (the level
// after it, max - new_debt, is at least 0) and which the expiry covers
// (value >= 0). refilledLua: the bucket had refilled to full while its key
// lived (new_debt < n), and the take is done once the value changes by
// new_debt - n, which makes the debt n, the level max - n.
const (
	decrementedLua = `value >= 0 and new_debt >= n and new_debt <= max and (ttl - 1) * rate < max`
	refilledLua    = `new_debt < n and ttl * rate >= n and (ttl - 1) * rate < max and value + n < 9007199254740992`
)

// rewriteLua rewrites the record of the bucket read as ttl and raw_debt
// with the debt new_debt (> 0) and the expiry burst_offset away:
// absolutely when the bucket owed units, so that a millisecond that ends
// within the script cannot shift the debt (see above).
const rewriteLua = `
local remainder = max % rate
if remainder < 0 then remainder = remainder + rate end
local burst_offset = (max - remainder) / rate
if remainder > 0 then burst_offset = burst_offset + 1 end
if ttl > 0 and raw_debt > 0 then
  redis.call('SET', key, string.format('%d', burst_offset * rate - new_debt), 'PXAT', string.format('%d', redis.call('PEXPIRETIME', key) - ttl + burst_offset))
else
  redis.call('SET', key, string.format('%d', burst_offset * rate - new_debt), 'PX', string.format('%d', burst_offset))
end
`

// writeLua writes the record of the bucket read as ttl, raw_debt and debt
// after the op (op r: a refund of n; any other op: a take of n), value
// being the key's value as it stands, and sets level to the level after
// the op. A bucket that is full again loses its key. While the key
// expires within an empty bucket's fill time and its expiry covers the new
// debt, the value alone changes; otherwise rewriteLua writes the record.
const writeLua = `
local new_debt = debt + n
if op == 'r' then new_debt = debt - n end
if new_debt <= 0 then
  if ttl ~= -2 then redis.call('DEL', key) end
  new_debt = 0
elseif ttl > 0 and raw_debt <= max and (ttl - 1) * rate < max and ttl * rate >= new_debt then
  local delta = ttl * rate - new_debt - value
  if delta == -n then
    redis.call('DECRBY', key, n_arg)
  elseif delta == n then
    redis.call('INCRBY', key, n_arg)
  elseif delta ~= 0 then
    redis.call('INCRBY', key, string.format('%d', delta))
  end
else
` + rewriteLua + `
end
level = max - new_debt
`

// applyLua decides op (r: refund, p: peek, t: take) on a bucket of Multi
// or MultiPeriod read as ttl, raw_debt, debt and value, writes it when it
// applies (a refund always, a take when all_fit says every bucket of the
// call holds its n) and sets reply to the script's integer for the
// bucket: the level after the op when n units were available (or
// refunded), and -(level+1) when they were not.
const applyLua = `
local level = max - debt
local reply = level
if op == 'r' or op == 't' and all_fit then
` + writeLua + `
  reply = level
elseif level < n then
  reply = -level - 1
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
// only when it fits. A take on an absent key writes the record at once.
// Update spells out its own op and reply, rather than applyLua's, so that
// a refusal or a peek ends as soon as it is decided.
const Update = `
local key, op = KEYS[1], ARGV[4]
local max, rate, n_arg = ARGV[1] + 0, ARGV[2] + 0, ARGV[3]
local n = n_arg + 0
local ttl = redis.call('PTTL', key)
if ttl == -2 and (op == 'T' or op == 't') and n <= max then
  local raw_debt, new_debt = 0, n
` + rewriteLua + `
  return max - n
end
local raw_debt, debt, value, taken = 0, 0, 0, false
if ttl > 0 then
  if op == 'T' then
    value = redis.pcall('DECRBY', key, n_arg)
    if type(value) ~= 'number' then return redis.error_reply('` + Malformed + `') end
    local new_debt = ttl * rate - value
    if ` + decrementedLua + ` then return max - new_debt end
    if ` + refilledLua + ` then
      redis.call('INCRBY', key, string.format('%d', new_debt - n))
      return max - n
    end
    value, taken = value + n, true
  else
` + getValueLua + `
  end
  if not (` + recordValueLua + `) then
    if taken then redis.call('INCRBY', key, n_arg) end
    return redis.error_reply('` + Malformed + `')
  end
` + debtLua + `
elseif ttl == -1 then
  return redis.error_reply('` + Malformed + `')
end
local level = max - debt
if op ~= 'r' then
  if level < n then
    if taken then redis.call('INCRBY', key, n_arg) end
    return -level - 1
  elseif op == 'p' then
    return level
  end
  if taken then value = value - n end
end
` + writeLua + `
return level
`

// Level is what Update's reads (PTTL, then GET) say of a bucket's record, in
// Go: the level at Redis's millisecond of a bucket of max and rate (units
// per millisecond: see RateArg) whose key had the PTTL ttl and the value
// reply (GET's reply, read in the same transaction). A refusal or a peek
// decided on it is the one Update's t or p would return from the same two
// replies, so that a store can decide those with a MULTI/EXEC of two reads,
// which costs Redis a fraction of a script. Level reports false for what it
// leaves to the script: a record Update would refuse as Malformed, and any
// value but a decimal integer in [0, 2^53) as the scripts write it (see
// getValueLua). It is getValueLua and debtLua in Go, in their names.
func Level(max, rate, ttl int64, reply string) (int64, bool) {
	switch {
	case ttl == -2 || ttl == 0:
		// No key, or one that expires within this millisecond: Update
		// reads a full bucket.
		return max, true
	case ttl < 0:
		return 0, false
	}
	value, ok := recordValue(reply)
	if !ok {
		return 0, false
	}
	// The debt is rawDebt = ttl×rate - value clamped to [0, max].
	// ttl×rate exceeds max + value, and may overflow, exactly when
	// ttl > (max+value)/rate: the debt is max, the bucket empty.
	if ttl > (max+value)/rate {
		return 0, true
	}
	rawDebt := ttl*rate - value
	if rawDebt <= 0 {
		return max, true
	}
	debt := min(rawDebt, max)
	return max - debt, true
}

// recordValue parses s as a bucket record's value, getValueLua's rule in
// Go: a decimal integer of digits alone, with no leading zero but in "0",
// below 2^53. It reports false for anything else.
func recordValue(s string) (int64, bool) {
	// 2^53 has 16 digits, so 16 digits never overflow an int64.
	if len(s) == 0 || len(s) > 16 || s[0] == '0' && len(s) > 1 {
		return 0, false
	}
	var v int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if v >= 1<<53 {
		return 0, false
	}
	return v, true
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

// decrementLua is a T take's first step on bucket i (key, its arguments at
// ARGV[at]), inside a loop over the keys, as Update's T does it: DECRBY n,
// and when the reply shows the take admitted and the expiry covering it,
// appends the level to took (with, in fix[i], the INCRBY that a bucket which
// had refilled to full needs); otherwise it puts the units back and breaks
// out of the loop, leaving the keys before i for the caller to restore.
const decrementLua = `
local ttl = redis.call('PTTL', key)
if ttl <= 0 then break end
` + bucketArgsLua + `
local value = redis.pcall('DECRBY', key, n_arg)
if type(value) ~= 'number' then break end
local new_debt = ttl * rate - value
if ` + decrementedLua + ` then
  took[#took + 1] = max - new_debt
elseif ` + refilledLua + ` then
  took[#took + 1] = max - n
  fix = fix or {}
  fix[i] = new_debt - n
else
  redis.call('INCRBY', key, n_arg)
  break
end
`

// fixLua completes a T take that every bucket admitted: the INCRBYs that
// decrementLua left in fix.
const fixLua = `
if fix then
  for i, delta in pairs(fix) do redis.call('INCRBY', KEYS[i], string.format('%d', delta)) end
end
`

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
  local took, fix, done = {}, nil, 0
  for i = 1, nk do
    local key, at = KEYS[i], 3 * i - 1
` + decrementLua + `
    done = i
  end
  if done == nk then
` + fixLua + `
    return took
  end
  for i = 1, done do redis.call('INCRBY', KEYS[i], ARGV[3 * i + 1]) end
  op = 't'
end
local ttls, raw_debts, debts, values, all_fit = {}, {}, {}, {}, true
for i = 1, nk do
  local key, at = KEYS[i], 3 * i - 1
` + bucketArgsLua + readBucketLua + `
end
local out = {}
for i = 1, nk do
  local key, at = KEYS[i], 3 * i - 1
` + bucketArgsLua + `
  local ttl, raw_debt, debt, value = ttls[i], raw_debts[i], debts[i], values[i]
` + applyLua + `
  out[i] = reply
end
return out
`

// ClockSkew is the message of the error MultiPeriod returns when Redis's
// clock is outside a period counter's bounds; the stores turn it into
// ratekit.ErrClockSkew.
const ClockSkew = "kvstore: clock skew"

// The period counter's record. A counter is a hash of one field, named by
// its period, "<start µs> <end µs>" (each number digits alone, no leading
// zero), whose value is the count (an integer HINCRBY can change), with
// the key's expiry at the period's end plus a minute: ceil(end/1000) +
// 60,000 ms, set exactly. The field's end is the record's clock: while
// the key lives, Redis's clock in milliseconds is that expiry less the
// key's PTTL, so that a take on the record of the period the client's
// clock is in needs neither TIME nor parsing: HINCRBY of the field the
// client names, which returns the count, and PTTL, which places Redis's
// clock in the period. A record of an ended period lives its minute on
// and counts zero; the minute lets the expiry tell its clock after the
// period's end, and it is never read by a later period as its own, since
// its field names its period.
//
// What a record counts in the period picked (kvstore.PeriodBounds.Apply):
// its count when it started at or after the period's start (its own
// period, or a later one's: the client's periods moved back, as when a
// billing anchor changes), and zero when it started before. A record kept
// for a later start is rewritten as "<its start> <the later end>", so that
// its expiry covers the period picked as well as its own. A record of an
// older release, "<count> <start>" in a string whose expiry is its
// period's end plus a minute, is read with those rules, its end the
// earliest its expiry allows (an expiry is whole milliseconds, so that the
// end of the period picked is taken when they agree), and rewritten as a
// hash when a call writes it; an older release
// fails on a hash with Malformed. Every number is below 2^53, so exact in Lua's doubles.

// MultiPeriod is kvstore.PeriodCounter's UpdateMulti in Lua: Multi's token
// buckets, with the same arithmetic on the same records, and period
// counters (kvstore.PeriodBounds.Apply, on the records described above),
// decided together on Redis's clock in whole milliseconds. The stores run
// it only for calls that hold a period counter, so that Multi, and calls of
// buckets alone, read no clock.
//
// ARGV[1] is the op (T or t: take, p or r); then, key by key in KEYS order,
// a bucket is "b", max, rate (units per millisecond), n, and a period
// counter is "p", b0, "<b1> <b2>" (the field of the period the client's
// clock is in), b3 (bounds in microseconds since the epoch), span, quota,
// n, where span is the largest PTTL a record of [b1, b2) has while Redis's
// clock is at or after b0: ceil(b2/1000) + 60000 - ceil(b0/1000).
//
// T (decrement first) takes from the keys in order and is done when every
// key admitted its take: for a counter, HINCRBY of n on the client's
// field, whose count must have been at least 1 before (the record of that
// period) and must fit the quota, and a PTTL placing Redis's clock in [b0,
// b2); for a bucket, Multi's PTTL and DECRBY. It then replies, key by key,
// a bucket's level and a counter's count and PTTL, with no clock and no
// period: the stores place the clock from the PTTL (see
// ParsePeriodReply). A key that did not admit its take this way (a
// counter's first take in a period among them) ends the loop: what was
// taken is put back and the call goes on as t.
//
// t, p and r read TIME once and every key before anything is written: a
// clock outside a counter's [b0, b3) fails the call with ClockSkew, a
// record of the other kind (or anything else) with Malformed, and nothing
// changes. t writes only when the take applies to every key, and r, a
// refund, lowers a counter's count in the period picked only, deleting a
// record it brings to zero. The reply is an array: the clock in
// microseconds (a whole millisecond), then, key by key, one integer for a
// bucket, encoded as Multi's, and two for a period counter: the count
// after the op (before it, for a take that was refused) and the period
// picked (1, 2 or 3), negated when n units did not fit.
//
// In the script, kind_at[i] is the index in ARGV of key i's "b" or "p";
// for a counter, counts[i] is what its record counts in the period picked,
// periods[i] the period, fields[i] the record's field when a write keeps
// it (false when the record is rewritten), and ids[i] and ends[i] the field
// and the end of a rewritten record.
const MultiPeriod = `
local op, nk = ARGV[1], #KEYS
if op == 'T' then
  local took, fix, done, base = {}, nil, 0, 2
  for i = 1, nk do
    local key = KEYS[i]
    if ARGV[base] == 'p' then
      local field, n_arg = ARGV[base + 2], ARGV[base + 6]
      local count = redis.pcall('HINCRBY', key, field, n_arg)
      if type(count) ~= 'number' then break end
      local n, ttl = n_arg + 0, redis.call('PTTL', key)
      if count <= n or ttl <= 60000 or ttl > ARGV[base + 4] + 0 or count > ARGV[base + 5] + 0 then
        if count == n then
          redis.call('HDEL', key, field)
        elseif ttl ~= -2 then
          redis.call('HINCRBY', key, field, '-' .. n_arg)
        end
        break
      end
      took[#took + 1] = count
      took[#took + 1] = ttl
      base = base + 7
    else
      local at = base + 1
` + decrementLua + `
      base = base + 4
    end
    done = i
  end
  if done == nk then
` + fixLua + `
    return took
  end
  base = 2
  for i = 1, done do
    if ARGV[base] == 'p' then
      redis.call('HINCRBY', KEYS[i], ARGV[base + 2], '-' .. ARGV[base + 6])
      base = base + 7
    else
      redis.call('INCRBY', KEYS[i], ARGV[base + 3])
      base = base + 4
    end
  end
  op = 't'
end
local time = redis.call('TIME')
local now = (time[1] * 1000 + (time[2] - time[2] % 1000) / 1000) * 1000
local kind_at, counts, periods, fields, ids, ends, all_fit = {}, {}, {}, {}, {}, {}, true
local next_at = 2
for i = 1, nk do
  local key, base = KEYS[i], next_at
  kind_at[i] = base
  if ARGV[base] == 'b' then
    next_at = base + 4
  else
` + readCounterLua + `
    next_at = base + 7
  end
end
local ttls, raw_debts, debts, values = {}, {}, {}, {}
for i = 1, nk do
  local key, base = KEYS[i], kind_at[i]
  if ARGV[base] == 'b' then
    local at = base + 1
` + bucketArgsLua + readBucketLua + `
  end
end
local out = {now}
for i = 1, nk do
  local key, base = KEYS[i], kind_at[i]
  if ARGV[base] == 'b' then
    local at = base + 1
` + bucketArgsLua + `
    local ttl, raw_debt, debt, value = ttls[i], raw_debts[i], debts[i], values[i]
` + applyLua + `
    out[#out + 1] = reply
  else
    local quota, n, period = ARGV[base + 5] + 0, ARGV[base + 6] + 0, periods[i]
    local count = counts[i]
    local fits = count + n <= quota
    local write = false
    if op == 't' and all_fit then
      count = count + n
      write = true
    elseif op == 'r' and count > 0 then
      count = count - n
      if count < 0 then count = 0 end
      write = true
    end
    if write then
` + writeCounterLua + `
    end
    out[#out + 1] = count
    if op ~= 'r' and not fits then out[#out + 1] = -period else out[#out + 1] = period end
  end
end
return out
`

// readCounterLua reads the record of a period counter of MultiPeriod, key
// i under the locals key and base (the index of its "p" in ARGV), and
// keeps in counts, periods, fields, ids and ends what it counts in the
// period picked by now and how a write must store it; all_fit becomes
// false when the count cannot take its n. A clock outside the bounds fails
// the script with ClockSkew, a key that holds anything but a counter's
// record (of this release or an older one) with Malformed, before
// anything is written.
const readCounterLua = `
local quota, n, field = ARGV[base + 5] + 0, ARGV[base + 6] + 0, ARGV[base + 2]
local space = string.find(field, ' ', 1, true)
local b1, b2 = string.sub(field, 1, space - 1) + 0, string.sub(field, space + 1) + 0
local period, period_start, period_end
if now >= b1 then
  if now < b2 then period, period_start, period_end = 2, b1, b2
  elseif now < ARGV[base + 3] + 0 then period, period_start, period_end = 3, b2, ARGV[base + 3] + 0 end
elseif now >= ARGV[base + 1] + 0 then period, period_start, period_end = 1, ARGV[base + 1] + 0, b1 end
if not period then return redis.error_reply('` + ClockSkew + `: Redis TIME ' .. string.format('%d', now) .. ' us is outside [' .. ARGV[base + 1] .. ', ' .. ARGV[base + 3] .. ')') end
local count, kept, start, stop = 0, nil, nil, nil
local hash = redis.pcall('HGETALL', key)
if hash.err then
  local record = redis.pcall('GET', key)
  local space = type(record) == 'string' and string.find(record, ' ', 1, true)
  if not space then return redis.error_reply('` + Malformed + `') end
  count, start = string.sub(record, 1, space - 1), string.sub(record, space + 1)
  local expiry = redis.call('PEXPIRETIME', key) - 60000
  if expiry < 0 then return redis.error_reply('` + Malformed + `') end
  stop = string.format('%d', expiry * 1000 - 999)
elseif #hash == 2 then
  kept = hash[1]
  local space = string.find(kept, ' ', 1, true)
  if not space then return redis.error_reply('` + Malformed + `') end
  count, start, stop = hash[2], string.sub(kept, 1, space - 1), string.sub(kept, space + 1)
elseif #hash ~= 0 then
  return redis.error_reply('` + Malformed + `')
end
if start then
  local c, s, e = tonumber(count), tonumber(start), tonumber(stop)
  if not (c and s and e and c >= 0 and c < 9007199254740992 and s >= 0 and s < e and e < 9007199254740992 and c % 1 == 0 and s % 1 == 0 and e % 1 == 0 and string.format('%d', c) == count and string.format('%d', s) == start and string.format('%d', e) == stop) then
    return redis.error_reply('` + Malformed + `')
  end
  count = c
  if s < period_start then
    count, kept, s, e = 0, nil, period_start, period_end
  elseif e < period_end then
    kept, e = nil, period_end
  end
  ids[i], ends[i] = string.format('%d %d', s, e), e
else
  ids[i], ends[i] = string.format('%d %d', period_start, period_end), period_end
end
counts[i], periods[i], fields[i] = count, period, kept or false
if count + n > quota then all_fit = false end
`

// writeCounterLua writes the record of a period counter of MultiPeriod,
// key i under the local key, as count: it deletes a record brought to
// zero, changes the count of a record whose field stays, and otherwise
// writes the record anew (in place of whatever the key held), its field
// ids[i] and its expiry a minute after ends[i], ceil(ends[i]/1000) + 60000
// ms (Lua's % of a double can land one 1000 below, which it corrects, as
// rewriteLua does).
const writeCounterLua = `
if count == 0 then
  redis.call('DEL', key)
elseif fields[i] then
  redis.call('HSET', key, fields[i], string.format('%d', count))
else
  redis.call('DEL', key)
  local up, rest = ends[i] + 999, (ends[i] + 999) % 1000
  if rest < 0 then rest = rest + 1000 end
  redis.call('HSET', key, ids[i], string.format('%d', count))
  redis.call('PEXPIREAT', key, string.format('%d', (up - rest) / 1000 + 60000))
end
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

// Key appends to t the Redis key of key in the empty group, prefix + "{"
// + key + "}" (the key of an ordinary Update), and returns it.
func (t *Text) Key(prefix, key string) string {
	at := len(t.buf)
	t.buf = append(t.buf, prefix...)
	t.buf = append(t.buf, '{')
	t.buf = append(t.buf, key...)
	t.buf = append(t.buf, '}')
	return t.since(at)
}

// MultiKeys appends to dst the Redis keys of updates in group, in order,
// written to t: prefix + "{" + key + "}" in the empty group (the key of an
// ordinary Update), and otherwise prefix + "g" + kvstore.GroupKey(group,
// key), whose hash tag depends on the group alone, so that a group's keys
// share a Redis Cluster hash slot; the "g" keeps grouped keys apart from
// the ordinary ones.
func MultiKeys(dst []string, t *Text, prefix, group string, updates []kvstore.Update) []string {
	if group == "" {
		for i := range updates {
			dst = append(dst, t.Key(prefix, updates[i].Key))
		}
		return dst
	}
	for i := range updates {
		at := len(t.buf)
		t.buf = append(t.buf, prefix...)
		t.buf = append(t.buf, "g{"...)
		t.buf = strconv.AppendInt(t.buf, int64(len(group)), 10)
		t.buf = append(t.buf, ':')
		t.buf = append(t.buf, group...)
		t.buf = append(t.buf, '}')
		t.buf = append(t.buf, updates[i].Key...)
		dst = append(dst, t.since(at))
	}
	return dst
}

// UpdateArgs appends to dst Update's ARGV for a Refill r, a cost n and the
// op argument op, the numbers written to t.
func UpdateArgs(dst []string, t *Text, r kvstore.Refill, n int64, op string) []string {
	return append(dst, t.Int(r.Burst), t.Int(RateArg(r)), t.Int(n), op)
}

// MultiArgs appends to dst Multi's ARGV for the op argument op and
// updates, the numbers written to t.
func MultiArgs(dst []string, t *Text, op string, updates []kvstore.Update) []string {
	dst = append(dst, op)
	for i := range updates {
		u := &updates[i]
		dst = append(dst, t.Int(u.Refill.Burst), t.Int(RateArg(u.Refill)), t.Int(u.N))
	}
	return dst
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
// anything else: each number must read back as FormatRecord writes it (no
// sign but a minus, no space, no leading zero).
func ParseRecord(s string) (kvstore.Record, bool) {
	a, b, ok := strings.Cut(s, " ")
	if !ok {
		return kvstore.Record{}, false
	}
	v, ok1 := parseDecimal(a)
	t, ok2 := parseDecimal(b)
	if !ok1 || !ok2 {
		return kvstore.Record{}, false
	}
	return kvstore.Record{Value: v, Time: t}, true
}

// parseDecimal parses s as strconv.FormatInt writes an int64, and reports
// false for anything else.
func parseDecimal(s string) (int64, bool) {
	v, err := strconv.ParseInt(s, 10, 64)
	var buf [20]byte
	return v, err == nil && string(strconv.AppendInt(buf[:0], v, 10)) == s
}

// PeriodArgs appends to dst the ARGV of MultiPeriod for the op argument op
// (T, t, p or r) and updates, which must have passed
// kvstore.CheckMultiPeriods, the numbers written to t.
func PeriodArgs(dst []string, t *Text, op string, updates []kvstore.Update) []string {
	dst = append(dst, op)
	for i := range updates {
		u := &updates[i]
		if p := u.Period; p != nil {
			b := &p.Bounds
			dst = append(dst, "p", t.Int(b[0]), t.Field(b[1], b[2]), t.Int(b[3]), t.Int(span(b)), t.Int(p.Quota), t.Int(u.N))
			continue
		}
		dst = append(dst, "b", t.Int(u.Refill.Burst), t.Int(RateArg(u.Refill)), t.Int(u.N))
	}
	return dst
}

// ceilMilli returns the microseconds us (at least 0) in whole
// milliseconds, rounded up.
func ceilMilli(us int64) int64 { return (us + 999) / 1000 }

// counterExpiry returns the expiry, in milliseconds since the epoch, of
// the record of a period that ends at end (microseconds): a minute after
// the end.
func counterExpiry(end int64) int64 { return ceilMilli(end) + 60_000 }

// span returns MultiPeriod's span argument for bounds b: the largest PTTL
// the record of [b1, b2) has while Redis's clock is at or after b0.
func span(b *[4]int64) int64 { return counterExpiry(b[2]) - ceilMilli(b[0]) }

// PeriodReplyLen returns the length of MultiPeriod's reply for updates in
// the form of t, p, r and a T that went on as t; a T done on its first
// pass replies one integer fewer (see ParsePeriodReply).
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
// of updates, and reports false when vals is not such a reply. A reply one
// shorter than PeriodReplyLen is a T take every key admitted on its first
// pass: a bucket's level, and a counter's count and PTTL, the key's expiry
// (a minute after b2) less Redis's clock in milliseconds, which places the
// clock in [b0, b2); a clock before b1 counts in period 1, where the
// record of [b1, b2) keeps its count (a record of a later period).
func ParsePeriodReply(vals []int64, updates []kvstore.Update, results []kvstore.OpResult) bool {
	full := PeriodReplyLen(updates)
	if len(vals) == full-1 {
		return parseTaken(vals, updates, results)
	}
	if len(vals) != full {
		return false
	}
	now, j := vals[0], 1
	for i := range updates {
		v := vals[j]
		j++
		p := updates[i].Period
		if p == nil {
			results[i] = DecodeLevel(v)
			continue
		}
		period := vals[j]
		j++
		r := kvstore.OpResult{OK: period > 0, Used: v, Now: now, Period: int(period)}
		if period < 0 {
			r.Period = int(-period)
		}
		if r.Period < 1 || r.Period > 3 || v < 0 {
			return false
		}
		r.Remaining = max(p.Quota-v, 0)
		results[i] = r
	}
	return true
}

// parseTaken is ParsePeriodReply for the reply of a T take done on its
// first pass.
func parseTaken(vals []int64, updates []kvstore.Update, results []kvstore.OpResult) bool {
	j := 0
	for i := range updates {
		v := vals[j]
		j++
		p := updates[i].Period
		if p == nil {
			if v < 0 {
				return false
			}
			results[i] = DecodeLevel(v)
			continue
		}
		ttl := vals[j]
		j++
		b := &p.Bounds
		if v < 1 || v > p.Quota || ttl <= 60_000 || ttl > span(b) {
			return false
		}
		r := kvstore.OpResult{OK: true, Used: v, Remaining: p.Quota - v, Now: (counterExpiry(b[2]) - ttl) * 1000, Period: 2}
		if r.Now < b[1] {
			r.Period = 1
		}
		results[i] = r
	}
	return true
}

// DecodeLevel returns the result a bucket's integer in a script's reply
// encodes: the level after the op when its units were available, and
// -(level+1) when they were not.
func DecodeLevel(v int64) kvstore.OpResult {
	if v < 0 {
		return kvstore.OpResult{OK: false, Remaining: -v - 1}
	}
	return kvstore.OpResult{OK: true, Remaining: v}
}
