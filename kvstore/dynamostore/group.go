package dynamostore

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
)

// MaxClockAhead is how far ahead of a Store's clock the last write of a
// group item (by an instance whose clock runs ahead) may be before the
// Store refuses to decide on that item with an error matching
// ratekit.ErrClockSkew: a decision would otherwise follow a clock it
// cannot check. It equals TTLMargin.
const MaxClockAhead = TTLMargin

// DefaultHistoryTTL is how long the count of an ended period is kept when
// [Config.HistoryTTL] is zero: 400 days, so that a year of monthly periods
// can be billed again.
const DefaultHistoryTTL = 400 * 24 * time.Hour

// ttlSlack is added to the Time to Live a write gives a group item beyond
// what its records need, so that the common, blind take finds the item's
// Time to Live long enough and need not raise it (it cannot compute a
// maximum): only a take after ttlSlack without a slower write reads first.
const ttlSlack = int64(time.Hour / time.Second)

// The marks of the items this package writes apart from a plain key's:
// a group item's partition key is the prefix, groupMark and the group; a
// history item's the prefix, historyMark and the counter's name; an
// idempotency item's the prefix, idemMark and the id's name. A plain key
// that begins with one of these is a different item only by the
// attributes, which every read checks: it is reported as
// kvstore.ErrMalformedRecord, never rewritten.
const (
	groupMark   = "\xffg"
	historyMark = "\xffh"
	idemMark    = "\xffi"
)

// The attributes of a group item besides KeyAttribute and TTLAttribute.
// Records are attributes whose names begin with recUTF8 (a key that is
// valid UTF-8, as it is) or recHex (any other key, in hexadecimal).
const (
	attrGroup   = "g" // the mark: 1
	attrVersion = "w" // incremented by every decision's write
	attrWritten = "t" // the writer's clock at the last decision, µs
	recUTF8     = 'k'
	recHex      = 'h'
	idemUTF8    = 'i'
	idemHex     = 'j'
)

// Partitioned reports true: each group is one item, and DynamoDB updates
// one item per request without a transaction, so keys of the empty group
// (each an item of its own) cannot be updated together.
func (s *Store) Partitioned() bool { return true }

// CountsPeriods reports true: UpdateMulti keeps period counters.
func (s *Store) CountsPeriods() bool { return true }

// groupPK returns the partition key of a group's item.
func (s *Store) groupPK(mark, name string) (map[string]types.AttributeValue, error) {
	n := len(s.prefix) + len(mark) + len(name)
	if n > MaxKeyLen {
		return nil, fmt.Errorf("dynamostore: %w: a group of %d bytes with the prefix, DynamoDB's limit is %d", ratekit.ErrKeyTooLong, n-len(mark), MaxKeyLen)
	}
	b := make([]byte, 0, n)
	b = append(append(append(b, s.prefix...), mark...), name...)
	return map[string]types.AttributeValue{KeyAttribute: &types.AttributeValueMemberB{Value: b}}, nil
}

// recName returns the attribute name of key's record in a group item.
func recName(key string) string {
	if utf8.ValidString(key) {
		return string(recUTF8) + key
	}
	return string(recHex) + hex.EncodeToString([]byte(key))
}

// keyOfRec returns the key of a record's attribute name, and whether the
// name is a record's.
func keyOfRec(name string) (string, bool) {
	if name == "" {
		return "", false
	}
	switch name[0] {
	case recUTF8:
		return name[1:], true
	case recHex:
		b, err := hex.DecodeString(name[1:])
		return string(b), err == nil
	}
	return "", false
}

// UpdateMulti implements [kvstore.MultiAtomic] and [kvstore.PeriodCounter].
// A non-empty group is one item, and every key of the group, token bucket
// or period counter, is a record in it; a call is all or nothing because
// it writes that one item once. A take is one conditional UpdateItem in
// the common case; when its condition fails, or for a peek or a refund,
// UpdateMulti reads the item with a strongly consistent GetItem, decides
// with kvstore.Refill.Apply and kvstore.PeriodBounds.Apply on the Store's
// clock and writes with an exact condition, up to Config.MaxAttempts
// conditional writes (ErrContention after). A take that moves a counter into
// a later period keeps the ended period's count in the item and then
// writes it as a history item of its own ([Store.PeriodUsage]).
//
// The empty group holds the plain keys, one item each: a call with one
// bucket is [Store.Update]; a call with more keys fails with
// kvstore.ErrCrossPartition and a period counter with
// kvstore.ErrInvalidPeriod, before anything is sent.
//
// Errors are those of kvstore.PeriodCounter, ratekit.ErrEmptyKey and
// ratekit.ErrKeyTooLong for a key or group DynamoDB would refuse,
// ratekit.ErrClockSkew when the group item was last written by a clock
// more than MaxClockAhead ahead of the Store's, and
// kvstore.ErrMalformedRecord for an item this package did not write as a
// group item, or a key used as a bucket and as a counter.
func (s *Store) UpdateMulti(ctx context.Context, group string, op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult) error {
	_, err := s.updateMulti(ctx, group, op, updates, results, nil)
	return err
}

// call is one UpdateMulti call, checked.
type call struct {
	group   string
	pk      map[string]types.AttributeValue
	op      kvstore.Op
	updates []kvstore.Update
	names   []string // record attribute names, by update
	once    *onceArgs
}

func (s *Store) updateMulti(ctx context.Context, group string, op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult, once *onceArgs) (bool, error) {
	periods, err := kvstore.CheckMultiPeriods(op, updates, results)
	if err != nil {
		return false, err
	}
	if group == "" {
		return false, s.plainMulti(ctx, op, updates, results, periods, once != nil)
	}
	c := &call{group: group, op: op, updates: updates, names: make([]string, len(updates)), once: once}
	if c.pk, err = s.groupPK(groupMark, group); err != nil {
		return false, err
	}
	if err := checkDistinct(updates); err != nil {
		return false, err
	}
	for i, u := range updates {
		switch {
		case u.Key == "":
			return false, fmt.Errorf("dynamostore: %w (update %d)", ratekit.ErrEmptyKey, i)
		case len(u.Key) > MaxKeyLen:
			return false, fmt.Errorf("dynamostore: %w: update %d has %d bytes, the limit in a group is %d", ratekit.ErrKeyTooLong, i, len(u.Key), MaxKeyLen)
		}
		c.names[i] = recName(u.Key)
	}
	now := s.now().UnixMicro()
	for i, u := range updates {
		if u.Period != nil && u.Period.Pick(now) == 0 {
			return false, fmt.Errorf("dynamostore: update %d: %w: the Store's clock %d µs is outside [%d, %d)", i, ratekit.ErrClockSkew, now, u.Period.Bounds[0], u.Period.Bounds[3])
		}
	}
	writes := 0
	if op == kvstore.OpTake && once == nil {
		writes++
		if ok, err := s.fastTake(ctx, c, now, results, func(i int) int { return s.hintForm(c, i, now) }); err != nil || ok {
			return false, err
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return false, fmt.Errorf("dynamostore: %w", err)
		}
		done, replayed, err := s.slowStep(ctx, c, results, &writes)
		if err != nil || done {
			return replayed, err
		}
	}
}

// plainMulti is UpdateMulti in the empty group: one bucket is Update; more
// keys, a counter or an idempotency key are refused.
func (s *Store) plainMulti(ctx context.Context, op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult, periods, once bool) error {
	switch {
	case periods:
		return fmt.Errorf("dynamostore: %w: a period counter needs a non-empty group (one item holds the group)", kvstore.ErrInvalidPeriod)
	case len(updates) > 1:
		if err := checkDistinct(updates); err != nil {
			return err
		}
		return fmt.Errorf("dynamostore: %w: the empty group's keys are items of their own", kvstore.ErrCrossPartition)
	case once:
		return fmt.Errorf("dynamostore: %w: an idempotent call needs a non-empty group", kvstore.ErrInvalidOp)
	}
	u := updates[0]
	res, err := s.Update(ctx, u.Key, u.Refill, op, u.N)
	if err == nil {
		results[0] = res
	}
	return err
}

// checkDistinct returns kvstore.ErrDuplicateKey for updates that name a
// key twice.
func checkDistinct(updates []kvstore.Update) error {
	seen := make(map[string]struct{}, len(updates))
	for _, u := range updates {
		if _, dup := seen[u.Key]; dup {
			return fmt.Errorf("dynamostore: %w: %q", kvstore.ErrDuplicateKey, u.Key)
		}
		seen[u.Key] = struct{}{}
	}
	return nil
}

// exprBuilder collects the parts of an UpdateItem's expressions.
type exprBuilder struct {
	names  map[string]string
	values map[string]types.AttributeValue
	set    []string
	remove []string
	cond   []string
}

func newExpr() *exprBuilder {
	return &exprBuilder{
		names:  map[string]string{"#ttl": TTLAttribute},
		values: map[string]types.AttributeValue{},
	}
}

func (e *exprBuilder) input(s *Store, pk map[string]types.AttributeValue) *dynamodb.UpdateItemInput {
	var upd strings.Builder
	if len(e.set) > 0 {
		upd.WriteString("SET ")
		upd.WriteString(strings.Join(e.set, ", "))
	}
	if len(e.remove) > 0 {
		upd.WriteString(" REMOVE ")
		upd.WriteString(strings.Join(e.remove, ", "))
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                           s.table,
		Key:                                 pk,
		UpdateExpression:                    aws.String(upd.String()),
		ExpressionAttributeNames:            e.names,
		ExpressionAttributeValues:           e.values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		ReturnConsumedCapacity:              s.capacityMode(),
	}
	if len(e.cond) > 0 {
		in.ConditionExpression = aws.String(strings.Join(e.cond, " AND "))
	}
	if len(e.values) == 0 {
		in.ExpressionAttributeValues = nil
	}
	return in
}

// big returns a number attribute of an integer of any size.
func bigNum(x *big.Int) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: x.String()}
}

// bucketNeed returns the expiry of a bucket record written at now with r:
// when a bucket emptied then would be full again.
func bucketExpiry(r kvstore.Refill, now int64) int64 {
	return now + int64(r.TimeToFull(0)/time.Microsecond)
}

// historyTTL returns Config.HistoryTTL in microseconds.
func (s *Store) historyMicros() int64 { return int64(s.historyTTL / time.Microsecond) }

// counterNeed returns until when a counter record whose period ends at end
// must be kept: the end plus the history's time to live, since the record
// holds the period's count until a later period moves it to the history.
func (s *Store) counterNeed(end int64) int64 {
	return min(end, kvstore.MaxPeriodBound) + s.historyMicros()
}

// The forms of a record in a blind take.
const (
	formFull    = iota // a bucket absent, expired or full
	formPartial        // a bucket with the call's rate, not full
	formNew            // a counter absent
	formSame           // a counter in the call's period
	formNone           // none fits: decide on the item as read
)

// hintForm returns the form the Store's hints predict for update u, named
// name, at now.
func (s *Store) hintForm(c *call, i int, now int64) int {
	u := c.updates[i]
	hk := hintKey(c.pk, c.names[i])
	if u.Period == nil {
		if full, seen := s.hints.getKey(hk, now); full || !seen {
			return formFull
		}
		return formPartial
	}
	start := u.Period.Bounds[u.Period.Pick(now)-1]
	if known, seen := s.hints.getValue(hk); seen && known != start {
		return formNone
	}
	return formSame
}

// itemForm returns the form of update i on the item it as read at now.
func itemForm(c *call, i int, it groupItem, now int64) int {
	u := c.updates[i]
	rec, ok := it.recs[c.names[i]]
	if u.Period == nil {
		switch {
		case !ok || rec.kind == kindBucket && rec.e <= now:
			return formFull
		case rec.kind != kindBucket || rec.r != u.Refill.Rate:
			return formNone
		case rec.view(u.Refill, now).Value >= u.Refill.Burst:
			return formFull
		}
		return formPartial
	}
	switch {
	case !ok:
		return formNew
	case rec.kind == kindCounter && rec.cur.start == u.Period.Bounds[u.Period.Pick(now)-1]:
		return formSame
	}
	return formNone
}

// fastTake sends the blind take of c: one UpdateItem whose condition holds
// for every writer racing on the item, each record in the form form gives.
// It reports whether the take was applied (results written), or false when
// the condition failed or no form fits (nothing written): the caller then
// decides on the item as read.
func (s *Store) fastTake(ctx context.Context, c *call, now int64, results []kvstore.OpResult, form func(i int) int) (bool, error) {
	e := newExpr()
	nowV := num(now)
	e.values[":g"] = num(1)
	e.values[":one"] = num(1)
	e.values[":zero"] = num(0)
	e.values[":now"] = nowV
	e.values[":tmax"] = num(now + int64(MaxClockAhead/time.Microsecond))
	e.cond = append(e.cond,
		"(attribute_not_exists("+KeyAttribute+") OR "+attrGroup+" = :g)",
		"(attribute_not_exists("+attrWritten+") OR "+attrWritten+" <= :tmax)")
	e.set = append(e.set, attrGroup+" = :g", attrVersion+" = if_not_exists("+attrVersion+", :zero) + :one", attrWritten+" = :now")
	need := int64(0)
	for i, u := range c.updates {
		a, p := "#a"+strconv.Itoa(i), ":"+strconv.Itoa(i)
		e.names[a] = c.names[i]
		f := form(i)
		if u.Period == nil {
			r := u.Refill
			nowR := new(big.Int).Mul(big.NewInt(now), big.NewInt(r.Rate))
			fl := new(big.Int).Sub(nowR, big.NewInt(r.Burst))
			exp := bucketExpiry(r, now)
			need = max(need, exp)
			e.values[p+"r"] = num(r.Rate)
			e.values[p+"f"] = bigNum(fl)
			switch f {
			case formFull:
				x := new(big.Int).Add(fl, big.NewInt(u.N))
				e.values[p+"m"] = &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
					"x": bigNum(x), "r": num(r.Rate), "t": nowV, "e": num(exp),
				}}
				e.cond = append(e.cond, "(attribute_not_exists("+a+") OR "+a+".e <= :now OR ("+a+".r = "+p+"r AND "+a+".x <= "+p+"f))")
				e.set = append(e.set, a+" = "+p+"m")
			case formPartial:
				e.values[p+"c"] = bigNum(nowR.Sub(nowR, big.NewInt(u.N)))
				e.values[p+"n"] = num(u.N)
				e.values[p+"e"] = num(exp)
				e.cond = append(e.cond, "("+a+".e > :now AND "+a+".r = "+p+"r AND "+a+".x BETWEEN "+p+"f AND "+p+"c)")
				e.set = append(e.set, a+".x = "+a+".x + "+p+"n", a+".t = :now", a+".e = "+p+"e")
			default:
				return false, nil
			}
			continue
		}
		pb := u.Period
		idx := pb.Pick(now)
		start, end := pb.Bounds[idx-1], pb.Bounds[idx]
		need = max(need, s.counterNeed(end))
		switch f {
		case formNew:
			e.values[p+"m"] = &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
				"s": num(start), "n": num(end), "c": num(u.N),
			}}
			e.cond = append(e.cond, "attribute_not_exists("+a+")")
			e.set = append(e.set, a+" = "+p+"m")
		case formSame:
			e.values[p+"s"] = num(start)
			e.values[p+"q"] = num(pb.Quota - u.N)
			e.values[p+"n"] = num(u.N)
			e.cond = append(e.cond, "("+a+".s = "+p+"s AND "+a+".c <= "+p+"q)")
			e.set = append(e.set, a+".c = "+a+".c + "+p+"n")
		default:
			return false, nil
		}
	}
	e.values[":need"] = num(ttlSeconds(need))
	e.values[":ttl"] = num(ttlSeconds(need) + ttlSlack)
	e.cond = append(e.cond, "(attribute_not_exists(#ttl) OR #ttl >= :need)")
	e.set = append(e.set, "#ttl = if_not_exists(#ttl, :ttl)")
	in := e.input(s, c.pk)
	in.ReturnValues = types.ReturnValueAllNew
	out, err := s.client.UpdateItem(ctx, in, noRetries)
	if out != nil {
		s.observe(out.ConsumedCapacity)
	}
	failed, err := conditional(ctx, "UpdateItem", err)
	if err != nil || failed != nil {
		return false, err
	}
	it, err := parseGroup(out.Attributes)
	if err != nil {
		return false, err
	}
	for i, u := range c.updates {
		rec, ok := it.recs[c.names[i]]
		if !ok {
			return false, fmt.Errorf("%w: record %q missing after a take", kvstore.ErrMalformedRecord, c.names[i])
		}
		results[i] = s.fastResult(c.pk, c.names[i], u, rec, now)
	}
	return true, nil
}

// fastResult returns the result of a blind take that was applied, from the
// record it wrote, and records the hint of the record's next form.
func (s *Store) fastResult(pk map[string]types.AttributeValue, name string, u kvstore.Update, rec groupRec, now int64) kvstore.OpResult {
	hk := hintKey(pk, name)
	if u.Period == nil {
		lvl := rec.level(u.Refill, now)
		s.hints.setKey(hk, now+int64(u.Refill.TimeToFull(lvl)/time.Microsecond))
		return kvstore.OpResult{OK: true, Remaining: lvl}
	}
	s.hints.setValue(hk, rec.cur.start)
	idx := u.Period.Pick(now)
	return kvstore.OpResult{OK: true, Used: rec.cur.used, Remaining: max(u.Period.Quota-rec.cur.used, 0), Now: now, Period: idx}
}

// slowStep reads the group item, decides the call on it and, when the
// decision writes, sends the write conditioned on the item's version. It
// reports whether the call is done (results written), and whether its
// results were replayed for an idempotency key.
func (s *Store) slowStep(ctx context.Context, c *call, results []kvstore.OpResult, writes *int) (done, replayed bool, err error) {
	raw, err := s.readCap(ctx, c.pk)
	if err != nil {
		return false, false, err
	}
	it, err := parseGroup(raw)
	if err != nil {
		return false, false, err
	}
	now := s.now().UnixMicro()
	if it.present && it.written > now+int64(MaxClockAhead/time.Microsecond) {
		return false, false, fmt.Errorf("dynamostore: %w: the group's item was written at %d µs, more than %v ahead of this Store's clock %d µs", ratekit.ErrClockSkew, it.written, MaxClockAhead, now)
	}
	if c.once != nil {
		if ok, err := s.replay(ctx, c, it, now, results); err != nil || ok {
			return ok, ok, err
		}
	}
	d, err := s.decide(c, it, now, results)
	if err != nil || !d.write {
		return err == nil, false, err
	}
	if *writes >= s.attempts {
		return false, false, fmt.Errorf("%w: %d conditional writes on one group", ErrContention, *writes)
	}
	*writes++
	if d.blind(c, it, now) {
		// A take every record of which has a blind form on the item as
		// read: its range conditions let racing takes through, where
		// the version's would not.
		ok, err := s.fastTake(ctx, c, now, results, func(i int) int { return itemForm(c, i, it, now) })
		return ok, false, err
	}
	failed, err := s.writeDecision(ctx, c, it, now, d, results)
	if err != nil || failed != nil {
		return false, false, err
	}
	for i, u := range c.updates {
		rec, ok := d.next[c.names[i]]
		switch {
		case u.Period != nil:
			s.hints.setValue(hintKey(c.pk, c.names[i]), d.starts[i])
		case ok:
			s.hints.setKey(hintKey(c.pk, c.names[i]), now+int64(u.Refill.TimeToFull(rec.level(u.Refill, now))/time.Microsecond))
		default:
			s.hints.setKey(hintKey(c.pk, c.names[i]), now)
		}
	}
	s.afterWrite(ctx, c, d)
	return true, false, nil
}

// blind reports whether the decision d on it can be written by a blind
// take: a take with nothing to remove, move or record, on an item whose
// Time to Live covers it.
func (d decision) blind(c *call, it groupItem, now int64) bool {
	if c.op != kvstore.OpTake || c.once != nil || len(d.remove) > 0 || len(d.pending) > 0 || len(d.flush) > 0 {
		return false
	}
	if it.present && ttlSeconds(d.need) > it.ttl {
		return false
	}
	for i := range c.updates {
		if itemForm(c, i, it, now) == formNone {
			return false
		}
	}
	return true
}

// decision is what a call decided on a group item as read.
type decision struct {
	write   bool
	next    map[string]groupRec // records to write, by name
	remove  []string            // records to remove: full buckets, expired ones
	starts  []int64             // for a counter, its period's start after the call
	pending []pendingFlush      // ended periods this write keeps as pending
	flush   []pendingFlush      // pending periods to write to history before this write
	need    int64               // until when the call's records must be kept, µs
}

// pendingFlush is an ended period of a counter, on its way to the history.
type pendingFlush struct {
	name string
	key  string
	p    period
}

// decide applies c's op to every record of it at now, filling results, and
// returns what to write. A refused take writes nothing.
func (s *Store) decide(c *call, it groupItem, now int64, results []kvstore.OpResult) (decision, error) {
	d := decision{next: map[string]groupRec{}, starts: make([]int64, len(c.updates))}
	allOK := true
	for i, u := range c.updates {
		var err error
		if u.Period == nil {
			results[i], err = d.bucket(c, i, it, now)
		} else {
			results[i], err = s.counter(&d, c, i, it, now)
		}
		if err != nil {
			return d, err
		}
		allOK = allOK && results[i].OK
	}
	if c.op == kvstore.OpTake && !allOK {
		unTake(c.updates, results)
	}
	if c.op == kvstore.OpTake && !allOK || c.op == kvstore.OpPeek {
		d.next, d.remove, d.pending, d.flush = nil, nil, nil, nil
		return d, nil
	}
	for name, rec := range it.recs {
		if _, mine := d.next[name]; !mine && rec.kind == kindBucket && rec.e <= now {
			d.remove = append(d.remove, name)
		}
	}
	d.write = len(d.next) > 0 || len(d.remove) > 0 || c.once != nil
	return d, nil
}

// bucket decides update i of c, a token bucket, on it at now.
func (d *decision) bucket(c *call, i int, it groupItem, now int64) (kvstore.OpResult, error) {
	u, name := c.updates[i], c.names[i]
	rec, ok := it.recs[name]
	if ok && rec.kind != kindBucket {
		return kvstore.OpResult{}, fmt.Errorf("%w: key %q of the group is a period counter, used as a token bucket", kvstore.ErrMalformedRecord, u.Key)
	}
	live := ok && rec.e > now
	res, next, write, err := u.Refill.Apply(rec.view(u.Refill, now), live, now, c.op, u.N)
	if err != nil {
		return res, err
	}
	d.need = max(d.need, bucketExpiry(u.Refill, now))
	switch {
	case !write:
	case next.Value >= u.Refill.Burst:
		if ok {
			d.remove = append(d.remove, name)
		}
	default:
		d.next[name] = bucketRec(u.Refill, next)
	}
	return res, nil
}

// counter decides update i of c, a period counter, on it at now. A refund
// for an idempotency key whose take was decided before the counter's
// current period started gives nothing back: it reports the counter.
func (s *Store) counter(d *decision, c *call, i int, it groupItem, now int64) (kvstore.OpResult, error) {
	u, name := c.updates[i], c.names[i]
	rec, ok := it.recs[name]
	if ok && rec.kind != kindCounter {
		return kvstore.OpResult{}, fmt.Errorf("%w: key %q of the group is a token bucket, used as a period counter", kvstore.ErrMalformedRecord, u.Key)
	}
	op, n := c.op, u.N
	if c.once != nil && c.op == kvstore.OpRefund && c.once.takeAt >= 0 && ok && rec.cur.start > c.once.takeAt {
		op, n = kvstore.OpPeek, 1
	}
	res, next, write, err := u.Period.Apply(kvstore.Record{Value: rec.cur.used, Time: rec.cur.start}, ok, now, op, n)
	if err != nil {
		return res, err
	}
	if op != c.op {
		res.OK = true
	}
	d.need = max(d.need, s.counterNeed(u.Period.Bounds[res.Period]))
	switch {
	case write:
		d.starts[i] = next.Time
		d.next[name] = s.counterNext(d, name, u, rec, ok, next, res.Period)
	case ok:
		d.starts[i] = rec.cur.start
	default:
		d.starts[i] = u.Period.Bounds[res.Period-1]
	}
	return res, nil
}

// unTake turns the results of a take that some update refused into what
// each update held: those that could take report the units before the
// take, since nothing was taken.
func unTake(updates []kvstore.Update, results []kvstore.OpResult) {
	for i, u := range updates {
		if !results[i].OK {
			continue
		}
		if u.Period == nil {
			results[i].Remaining += u.N
			continue
		}
		results[i].Used -= u.N
		results[i].Remaining = max(u.Period.Quota-results[i].Used, 0)
	}
}

// counterNext returns the record of a counter after a write of next (from
// PeriodBounds.Apply on rec), noting in d the ended period it keeps as
// pending and any older pending period to flush first.
func (s *Store) counterNext(d *decision, name string, u kvstore.Update, rec groupRec, ok bool, next kvstore.Record, idx int) groupRec {
	out := groupRec{kind: kindCounter, cur: period{start: next.Time, used: next.Value}}
	if ok && next.Time == rec.cur.start {
		out.cur.end = rec.cur.end
		out.pend, out.hasPend = rec.pend, rec.hasPend
		return out
	}
	out.cur.end = u.Period.Bounds[idx]
	if ok && rec.hasPend {
		d.flush = append(d.flush, pendingFlush{name: name, key: u.Key, p: rec.pend})
	}
	if ok && rec.cur.used > 0 {
		out.pend, out.hasPend = rec.cur, true
		d.pending = append(d.pending, pendingFlush{name: name, key: u.Key, p: rec.cur})
	}
	return out
}

// writeDecision flushes the pending periods d replaces, then writes d on
// the item it was decided on, conditioned on its version. It returns the
// failure when another write came first.
func (s *Store) writeDecision(ctx context.Context, c *call, it groupItem, now int64, d decision, results []kvstore.OpResult) (*types.ConditionalCheckFailedException, error) {
	for _, f := range d.flush {
		if err := s.putHistory(ctx, c.group, f.key, f.p, now); err != nil {
			return nil, err
		}
	}
	e := newExpr()
	e.values[":g"] = num(1)
	e.values[":w"] = num(it.version + 1)
	e.values[":now"] = num(now)
	if it.present {
		e.values[":ow"] = num(it.version)
		e.cond = append(e.cond, attrGroup+" = :g AND "+attrVersion+" = :ow")
	} else {
		e.cond = append(e.cond, "attribute_not_exists("+KeyAttribute+")")
	}
	e.set = append(e.set, attrGroup+" = :g", attrVersion+" = :w", attrWritten+" = :now")
	need := int64(0)
	i := 0
	for name, rec := range d.next {
		a := "#n" + strconv.Itoa(i)
		i++
		e.names[a] = name
		e.values[":"+a[1:]] = rec.attr()
		e.set = append(e.set, a+" = :"+a[1:])
	}
	for j, name := range d.remove {
		a := "#d" + strconv.Itoa(j)
		e.names[a] = name
		e.remove = append(e.remove, a)
	}
	removed := make(map[string]bool, len(d.remove))
	for _, name := range d.remove {
		removed[name] = true
	}
	for name, rec := range it.recs {
		if _, over := d.next[name]; !over && !removed[name] {
			need = max(need, s.recNeed(rec))
		}
	}
	for _, rec := range d.next {
		need = max(need, s.recNeed(rec))
	}
	if c.once != nil {
		need = max(need, s.onceExpr(e, c, it, now, results))
	}
	e.values[":ttl"] = num(ttlSeconds(max(need, now)) + ttlSlack)
	e.set = append(e.set, "#ttl = :ttl")
	in := e.input(s, c.pk)
	out, err := s.client.UpdateItem(ctx, in, noRetries)
	if out != nil {
		s.observe(out.ConsumedCapacity)
	}
	return conditional(ctx, "UpdateItem", err)
}

// recNeed returns until when a record must be kept, in microseconds.
func (s *Store) recNeed(rec groupRec) int64 {
	if rec.kind == kindBucket {
		return rec.e
	}
	return s.counterNeed(max(rec.cur.end, rec.pend.end))
}

// afterWrite moves the ended periods that a write kept as pending to the
// history. A failure leaves them pending in the item, where the next move
// of the counter and PeriodUsage find them, so it is not the call's error:
// the decision was applied.
func (s *Store) afterWrite(ctx context.Context, c *call, d decision) {
	for _, f := range d.pending {
		if s.putHistory(ctx, c.group, f.key, f.p, s.now().UnixMicro()) != nil {
			continue
		}
		s.clearPending(ctx, c.pk, f.name, f.p.start)
	}
	if c.once != nil {
		s.moveIDs(ctx, c)
	}
}

// clearPending removes the pending period that starts at start from the
// record name, when it is still there.
func (s *Store) clearPending(ctx context.Context, pk map[string]types.AttributeValue, name string, start int64) {
	out, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       pk,
		UpdateExpression:          aws.String("REMOVE #a.ps, #a.pn, #a.pc"),
		ConditionExpression:       aws.String(attrGroup + " = :g AND #a.ps = :ps"),
		ExpressionAttributeNames:  map[string]string{"#a": name},
		ExpressionAttributeValues: map[string]types.AttributeValue{":g": num(1), ":ps": num(start)},
		ReturnConsumedCapacity:    s.capacityMode(),
	}, noRetries)
	if err == nil {
		s.observe(out.ConsumedCapacity)
	}
}

// readCap is read with ReturnConsumedCapacity when the Store observes it.
func (s *Store) readCap(ctx context.Context, k map[string]types.AttributeValue) (map[string]types.AttributeValue, error) {
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:              s.table,
		Key:                    k,
		ConsistentRead:         aws.Bool(true),
		ReturnConsumedCapacity: s.capacityMode(),
	}, noRetries)
	if err != nil {
		return nil, wrap(ctx, "GetItem", err)
	}
	s.observe(out.ConsumedCapacity)
	return out.Item, nil
}

// hintKey returns the hint key of a record of a group item.
func hintKey(pk map[string]types.AttributeValue, name string) []byte {
	b := pk[KeyAttribute].(*types.AttributeValueMemberB).Value
	k := make([]byte, 0, len(b)+1+len(name))
	return append(append(append(k, b...), 0), name...)
}
