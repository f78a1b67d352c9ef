package pgengine

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/ratekit/ratekit"
)

// maxCompositeCounters bounds the counters of one [Composite], so that one
// decision cannot hold an unbounded number of row locks.
const maxCompositeCounters = 16

// Composite decides over several [Counter]s of one [Store] at once: every
// operation is one call of a server-side function, one round trip and one
// transaction, that locks every counter's key in a fixed order (by key, then
// prefix, in byte order), so that two composites over the same keys never
// deadlock, and reads the database clock only once it holds them all. A take
// takes from every counter or, when any counter denies, from none. It is
// safe for concurrent use.
type Composite struct {
	store      *Store
	durability Durability
	counters   []*Counter
	query      string
	algs       []int64
	prefixes   []string
	quotas     []int64
	windows    []int64 // each counter's window, or emission interval for a token bucket
	ttls       []int64
	idemTTL    int64
	keepSync   bool
	cleanupP   float64
	batch      int64
	// periods holds each counter's Period (zero for the others), the
	// default of a call that passes none.
	periods  []ratekit.Period
	periodic bool
	// idemPrefix is the prefix idempotency records are kept under.
	idemPrefix string
	// scope distinguishes this composite's idempotency records from a
	// single counter's and from other composites' under the same prefix.
	scope [8]byte
}

// NewComposite returns a Composite over counters, in that order: element i
// of every request's parts and of every result belongs to counters[i]. The
// counters must belong to one Store, share one Durability and have distinct
// prefixes (two counters with one prefix would share rows); there must be 1
// to 16 of them. Their SynchronousCommit settings combine to the safer one,
// their cleanup settings to the largest probability and batch. It returns an
// error matching [ratekit.ErrInvalidConfig] otherwise and does not contact
// the database.
func NewComposite(counters ...*Counter) (*Composite, error) {
	return NewCompositeWith(CompositeOptions{}, counters...)
}

// CompositeOptions are the settings of a [Composite] that do not come from
// its counters. The zero value is NewComposite's.
type CompositeOptions struct {
	// Scope, when not empty, names the composite's idempotency records
	// instead of its counters' prefixes, so that composites of different
	// counters share them (a key's plans).
	Scope string

	// IdempotencyPrefix, when not empty, is the prefix the idempotency
	// records are kept under instead of the first counter's. It must be a
	// valid policy name; Reset forgets its records too.
	IdempotencyPrefix string

	// IdempotencyTTL, when positive, is how long an idempotency key is
	// remembered instead of the longest of the counters' windows.
	IdempotencyTTL time.Duration
}

// NewCompositeWith is NewComposite with options.
func NewCompositeWith(o CompositeOptions, counters ...*Counter) (*Composite, error) {
	if len(counters) == 0 || len(counters) > maxCompositeCounters {
		return nil, fmt.Errorf("%w: a composite takes 1 to %d limiters, got %d", ratekit.ErrInvalidConfig, maxCompositeCounters, len(counters))
	}
	for i, c := range counters {
		if c == nil {
			return nil, fmt.Errorf("%w: composite limiter %d is nil", ratekit.ErrInvalidConfig, i)
		}
	}
	first := counters[0]
	d := first.cfg.Durability
	m := &Composite{store: first.store, durability: d, counters: append([]*Counter(nil), counters...)}
	needSync, logged := false, false
	seen := make(map[string]bool, len(counters))
	scope := []byte("ratekit/composite/" + d.String())
	for i, c := range counters {
		if c.store != m.store {
			return nil, fmt.Errorf("%w: composite limiter %d uses another Store", ratekit.ErrInvalidConfig, i)
		}
		if c.cfg.Durability != d {
			return nil, fmt.Errorf("%w: composite limiter %d is %s, limiter 0 %s: a composite uses one durability", ratekit.ErrInvalidConfig, i, c.cfg.Durability, d)
		}
		if seen[c.cfg.Prefix] {
			return nil, fmt.Errorf("%w: composite limiters share prefix %q", ratekit.ErrInvalidConfig, c.cfg.Prefix)
		}
		seen[c.cfg.Prefix] = true
		if d == Logged {
			logged = true
			needSync = needSync || c.cfg.SynchronousCommit
		}
		alg := algCode(c.cfg.Algorithm)
		if !c.cfg.Period.IsZero() {
			alg = algPeriod
			m.periodic = true
		}
		m.algs = append(m.algs, alg)
		m.periods = append(m.periods, c.cfg.Period)
		m.prefixes = append(m.prefixes, c.cfg.Prefix)
		m.quotas = append(m.quotas, c.quota)
		m.windows = append(m.windows, c.windowUS)
		m.ttls = append(m.ttls, c.keepUS)
		m.idemTTL = max(m.idemTTL, c.ttlUS)
		m.cleanupP = max(m.cleanupP, c.cleanupP)
		m.batch = max(m.batch, c.batch)
		scope = appendLenPrefixed(scope, c.cfg.Prefix)
	}
	m.keepSync = needSync || !logged
	if o.Scope != "" {
		scope = append([]byte("ratekit/scope/"+d.String()+"/"), o.Scope...)
	}
	m.idemPrefix = m.prefixes[0]
	if o.IdempotencyPrefix != "" {
		if err := ratekit.ValidatePolicyName(o.IdempotencyPrefix); err != nil {
			return nil, fmt.Errorf("%w (idempotency prefix)", err)
		}
		m.idemPrefix = o.IdempotencyPrefix
	}
	if o.IdempotencyTTL > 0 {
		m.idemTTL = o.IdempotencyTTL.Microseconds()
	}
	h := hashBytes(scope)
	for i := range m.scope {
		m.scope[i] = byte(h >> (56 - 8*i))
	}
	// What never changes between calls is part of the statement, so that
	// a call encodes only the request's own arguments. Prefixes are policy
	// names (letters, digits, '-', '_', '.', ':'), safe in a literal.
	m.query = "SELECT " + m.store.quoted + "." + d.table("composite") + "($1, " +
		intArray(m.algs) + ", " + textArray(m.prefixes) + ", $2, $3, " +
		intArray(m.quotas) + ", " + intArray(m.windows) + ", " + intArray(m.ttls) + ", $4, '" +
		m.idemPrefix + "', $5, $6, " + strconv.FormatInt(m.idemTTL, 10) + ", $7, " + strconv.FormatBool(m.keepSync) + ", $8)"
	return m, nil
}

// Op is an operation of [Composite.Decide].
type Op int64

// The operations of [Composite.Decide].
const (
	OpTake   = Op(opTake)
	OpPeek   = Op(opPeek)
	OpRefund = Op(opRefund)
)

// Decide runs op (Take, Peek or Refund, with their rules and errors) on a
// request that the caller has validated ([ratekit.Request.Validate]), with
// the periods of the counters replaced by periods, one per counter (nil
// keeps the counters' own; a zero Period where a counter has one is
// refused). It is how a decision uses a key's own billing anchor without a
// counter per key.
func (m *Composite) Decide(ctx context.Context, op Op, key string, cost int64, parts []ratekit.Part, idempotencyKey string, periods []ratekit.Period) ([]Outcome, error) {
	if periods != nil && len(periods) != len(m.counters) {
		return nil, fmt.Errorf("%w: %d periods for a composite of %d policies", ratekit.ErrInvalidConfig, len(periods), len(m.counters))
	}
	if op == OpPeek {
		idempotencyKey = ""
	}
	return m.send(ctx, int64(op), key, cost, parts, idempotencyKey, periods)
}

// Counters returns the composite's counters, in order.
func (m *Composite) Counters() []*Counter { return append([]*Counter(nil), m.counters...) }

// Take takes parts[i].Cost units from parts[i].Key's quota of counter i for
// every i when every counter has them available, and otherwise takes
// nothing. Nil parts means key and cost for every counter. The results are
// in counter order; each one's Allowed reports whether that counter alone
// would admit its part, so the decision was admitted only when all are true.
//
// When idempotencyKey is not empty and a Take of this composite with the same
// key and idempotency key was admitted within the longest of the counters'
// windows, Take takes nothing and returns results with Allowed and Duplicate
// true. The record is kept under the first counter's prefix and key, written
// in the same transaction as the counters.
//
// Take returns errors matching [ratekit.ErrInvalidRequest] for bad input
// (see [ratekit.Request.Validate]; parts of another length than the
// counters; [ratekit.ErrCostExceedsQuota]) before contacting the database;
// other errors wrap the pgx error and, when ctx ended, ctx.Err(). After such
// an error the decision may or may not have been applied (to every counter
// or to none): a retry with the same idempotency key counts once.
func (m *Composite) Take(ctx context.Context, key string, cost int64, parts []ratekit.Part, idempotencyKey string) ([]Outcome, error) {
	return m.do(ctx, opTake, key, cost, parts, idempotencyKey, nil)
}

// Peek reports what Take would decide now, without taking or writing
// anything. It returns the same errors as Take.
func (m *Composite) Peek(ctx context.Context, key string, cost int64, parts []ratekit.Part) ([]Outcome, error) {
	return m.do(ctx, opPeek, key, cost, parts, "", nil)
}

// Refund gives every part's cost back to its counter, as [Counter.Refund]
// does for one, in one transaction. A non-empty idempotencyKey makes a
// retried refund count once. It returns the same errors as Take, except that
// a cost above a counter's capacity is allowed.
func (m *Composite) Refund(ctx context.Context, key string, cost int64, parts []ratekit.Part, idempotencyKey string) ([]Outcome, error) {
	return m.do(ctx, opRefund, key, cost, parts, idempotencyKey, nil)
}

// Reset forgets key under every counter (counter rows, sliding-log entries,
// idempotency records, including this composite's, which live under the
// first counter's prefix), in one statement that first takes the locks a
// take of key takes, in the same order, so that it never deadlocks with
// takes and refunds in flight. Keys that requests named only
// in their parts are forgotten only when passed as key themselves. It
// returns [ratekit.ErrEmptyKey] or [ratekit.ErrKeyTooLong] for an invalid
// key and otherwise errors that wrap the pgx error.
func (m *Composite) Reset(ctx context.Context, key string) error {
	var extra []string
	if m.idemPrefix != m.prefixes[0] {
		extra = []string{m.idemPrefix}
	}
	return resetKey(ctx, m.counters, extra, key, "composite reset")
}

// bounds returns the period bounds argument of the composite function for
// periods (nil: the counters'): for each counter with a period, the starts
// of the periods before, at and after the client's now and the end of the
// last, in microseconds since the epoch; zeros for the others.
func (m *Composite) bounds(periods []ratekit.Period) ([]int64, error) {
	b := make([]int64, 4*len(m.counters))
	if !m.periodic {
		return b, nil
	}
	if periods == nil {
		periods = m.periods
	}
	now := m.store.clock()
	shift := m.store.shift.Microseconds()
	for i, p := range periods {
		if m.algs[i] != algPeriod {
			if !p.IsZero() {
				return nil, fmt.Errorf("%w: policy %d has a period its counter was not made for", ratekit.ErrInvalidConfig, i)
			}
			continue
		}
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("policy %q: %w", m.prefixes[i], err)
		}
		start, end := p.Bounds(now)
		before, _ := p.Bounds(start.Add(-time.Nanosecond))
		_, after := p.Bounds(end)
		b[4*i] = before.UnixMicro() + shift
		b[4*i+1] = start.UnixMicro() + shift
		b[4*i+2] = end.UnixMicro() + shift
		b[4*i+3] = after.UnixMicro() + shift
	}
	return b, nil
}

// do validates the request and decides it.
func (m *Composite) do(ctx context.Context, op int64, key string, cost int64, parts []ratekit.Part, idem string, periods []ratekit.Period) ([]Outcome, error) {
	req := ratekit.Request{Key: key, Cost: cost, IdempotencyKey: idem, Parts: parts}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return m.send(ctx, op, key, cost, parts, idem, periods)
}

// send decides a valid request: one call of the composite function, alone
// or in a batch (see coalescer).
func (m *Composite) send(ctx context.Context, op int64, key string, cost int64, parts []ratekit.Part, idem string, periods []ratekit.Period) ([]Outcome, error) {
	keys, costs, locks, err := m.parts(op, key, cost, parts)
	if err != nil {
		return nil, err
	}
	bounds, err := m.bounds(periods)
	if err != nil {
		return nil, err
	}
	if err := m.store.ensureSchema(ctx); err != nil {
		return nil, err
	}
	var idemArg []byte
	if idem != "" && op != opPeek {
		idemArg = idempotencyRecord(op, tagCompositeTake, tagCompositeRefund, m.scope[:], idem)
	}
	var cleanup int64
	if op != opPeek && m.cleanupP > 0 && rand.Float64() < m.cleanupP {
		cleanup = m.batch
	}
	d := &decision{m: m, op: op, key: key, idem: idemArg, cleanup: cleanup, keys: keys, costs: costs, locks: locks, bounds: bounds}
	res, err := m.store.co.do(ctx, d)
	if err != nil {
		return nil, err
	}
	return m.outcomes(res.many), nil
}

// sendOne decides the composite decision d alone, in one statement.
func (m *Composite) sendOne(ctx context.Context, d *decision) (result, error) {
	raw, err := m.store.query(ctx, m.query, textResult, m.store.queryMode(), d.op, d.keys, d.costs, d.locks, []byte(d.key), d.idem, d.cleanup, d.bounds)
	if err != nil {
		return result{}, wrapErr(ctx, "composite", err)
	}
	out := make([]int64, 1+6*len(m.counters))
	if !parseInts(raw, out) {
		return result{}, wrapErr(ctx, "composite", fmt.Errorf("function returned %q, want a bigint[%d] in text form (schema version mismatch?)", raw, len(out)))
	}
	return result{many: out}, nil
}

// parts returns each counter's key, cost and sliding-log lock of a request
// (parts nil: key and cost for every counter), or an error for parts of
// another length than the counters or a take or peek above a quota.
func (m *Composite) parts(op int64, key string, cost int64, parts []ratekit.Part) (keys [][]byte, costs, locks []int64, err error) {
	n := len(m.counters)
	if parts != nil && len(parts) != n {
		return nil, nil, nil, fmt.Errorf("%w: %d parts for a composite of %d policies", ratekit.ErrInvalidRequest, len(parts), n)
	}
	keys = make([][]byte, n)
	costs = make([]int64, n)
	locks = make([]int64, n)
	for i, c := range m.counters {
		k, n := key, cost
		if parts != nil {
			k, n = parts[i].Key, parts[i].Cost
		}
		if op != opRefund && n > c.quota {
			return nil, nil, nil, fmt.Errorf("%w: part %d: cost %d, quota %d", ratekit.ErrCostExceedsQuota, i, n, c.quota)
		}
		if op == opRefund {
			n = c.refundCost(n)
		}
		keys[i], costs[i] = []byte(k), n
		if c.cfg.Algorithm == ratekit.SlidingLog {
			locks[i] = logLockID(c.cfg.Durability, c.cfg.Prefix, k)
		}
	}
	return keys, costs, locks, nil
}

// outcomes returns the composite function's result, out (1 + 6 integers per
// counter), as one Outcome per counter.
func (m *Composite) outcomes(out []int64) []Outcome {
	n := len(m.counters)
	res := make([]Outcome, n)
	for i := range res {
		v := out[1+6*i:]
		res[i] = Outcome{
			Allowed:    v[0] == 1,
			Remaining:  v[1],
			RetryAfter: microseconds(v[2]),
			ResetAfter: microseconds(v[3]),
			Period:     microseconds(v[4]),
			Used:       v[5],
			Duplicate:  out[0] == 1,
		}
	}
	return res
}

// intArray returns a bigint[] literal of v.
func intArray(v []int64) string {
	b := []byte("'{")
	for i, n := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, n, 10)
	}
	return string(append(b, "}'::bigint[]"...))
}

// textArray returns a text[] literal of names, which need no escaping.
func textArray(names []string) string {
	b := []byte("'{")
	for i, n := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, n...)
		b = append(b, '"')
	}
	return string(append(b, "}'::text[]"...))
}

// parseInts parses the text form of a bigint array, such as "{1,4,0}", into
// out and reports whether raw held exactly len(out) integers.
func parseInts(raw []byte, out []int64) bool {
	if len(raw) < 2 || raw[0] != '{' || raw[len(raw)-1] != '}' {
		return false
	}
	rest := raw[1 : len(raw)-1]
	for i := range out {
		end := bytes.IndexByte(rest, ',')
		if (i < len(out)-1) != (end >= 0) {
			return false
		}
		if end < 0 {
			end = len(rest)
		}
		v, err := strconv.ParseInt(string(rest[:end]), 10, 64)
		if err != nil {
			return false
		}
		out[i] = v
		if end < len(rest) {
			rest = rest[end+1:]
		}
	}
	return true
}
