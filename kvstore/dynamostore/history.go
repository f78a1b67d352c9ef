package dynamostore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratekit/ratekit/kvstore"
)

var _ kvstore.PeriodHistory = (*Store)(nil)

// The attributes of a history item besides KeyAttribute and TTLAttribute.
const (
	histGroup   = "hg" // the counter's group, Binary: the mark
	histKey     = "hk" // the counter's key, Binary
	histStart   = "s"
	histEnd     = "n"
	histUsed    = "c"
	histWritten = "at" // the writer's clock when it wrote the item, µs
)

// historyPK returns the partition key of the history item of a counter's
// period that starts at start: a digest of the group and key (which the
// item holds in full and a read checks) and the start.
func (s *Store) historyPK(group, key string, start int64) map[string]types.AttributeValue {
	sum := sha256.Sum256([]byte(kvstore.GroupKey(group, key)))
	b := make([]byte, 0, len(s.prefix)+len(historyMark)+16+8)
	b = append(append(append(b, s.prefix...), historyMark...), sum[:16]...)
	b = binary.BigEndian.AppendUint64(b, uint64(start))
	return map[string]types.AttributeValue{KeyAttribute: &types.AttributeValueMemberB{Value: b}}
}

// putHistory writes the count of a counter's ended period as an item of its
// own, unless it is there already: the write is idempotent, and the item
// keeps the time of its first write.
func (s *Store) putHistory(ctx context.Context, group, key string, p period, now int64) error {
	k := s.historyPK(group, key, p.start)
	item := map[string]types.AttributeValue{
		KeyAttribute: k[KeyAttribute],
		histGroup:    &types.AttributeValueMemberB{Value: []byte(group)},
		histKey:      &types.AttributeValueMemberB{Value: []byte(key)},
		histStart:    num(p.start),
		histEnd:      num(p.end),
		histUsed:     num(p.used),
		histWritten:  num(now),
		TTLAttribute: num(ttlSeconds(s.counterNeed(p.end))),
	}
	out, err := s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:              s.table,
		Item:                   item,
		ConditionExpression:    aws.String("attribute_not_exists(" + KeyAttribute + ")"),
		ReturnConsumedCapacity: s.capacityMode(),
	}, noRetries)
	if out != nil {
		s.observe(out.ConsumedCapacity)
	}
	_, err = conditional(ctx, "PutItem", err)
	return err
}

// historyItem is a history item as read.
type historyItem struct {
	group, key string
	p          period
	written    int64
}

// parseHistory reads a history item; it returns kvstore.ErrMalformedRecord
// for one this package did not write.
func parseHistory(m map[string]types.AttributeValue) (historyItem, error) {
	g, ok1 := m[histGroup].(*types.AttributeValueMemberB)
	k, ok2 := m[histKey].(*types.AttributeValueMemberB)
	if !ok1 || !ok2 || len(m) != 8 {
		return historyItem{}, fmt.Errorf("%w: not a history item of this package", kvstore.ErrMalformedRecord)
	}
	h := historyItem{group: string(g.Value), key: string(k.Value)}
	var err error
	if h.p, err = parsePeriod(m, histStart, histEnd, histUsed); err != nil {
		return historyItem{}, err
	}
	if h.written, err = intAttr(m, histWritten); err != nil {
		return historyItem{}, err
	}
	if _, err = intAttr(m, TTLAttribute); err != nil {
		return historyItem{}, err
	}
	return h, nil
}

// PeriodUsage implements [kvstore.PeriodHistory]: it reports the count of
// every period of every counter of this Store's groups whose key starts
// with keyPrefix and whose period starts in [from, to), ended or current,
// skipping periods in which nothing was counted, each once.
//
// It reads the whole table with a paginated, strongly consistent Scan
// (items of this Store's prefix: history items and group items, whose
// counters hold their current period and, for a moment after a move to a
// later period, the ended one). The order is the Scan's, which follows
// DynamoDB's hashes of the partition keys: no order of time, group or key.
// A Scan's cost is its table's size, whatever it reports: one read request
// unit per 4 KB read, about 262,144 units (about $0.033 on an on-demand
// table) per GB, filtered items included. An ended period found only in a
// group item (its history item not written yet) costs one more GetItem.
// Scan pages, being reads, go through the client's retryer (the SDK's
// standard one unless the client was given another), so a long billing
// Scan survives a transient network error; every write of the Store is
// sent at most once.
//
// A counter that moves to a later period during the call is reported once:
// the call remembers, for the rest of the Scan, each period it reported
// from a group item (memory in proportion to the counters it reports) and
// each history item written during the call (MaxClockAhead of clock skew
// allowed).
func (s *Store) PeriodUsage(ctx context.Context, keyPrefix string, from, to int64, fn func(kvstore.PeriodUsage) error) error {
	u := usageScan{
		s: s, keyPrefix: keyPrefix, from: from, to: to, fn: fn,
		recent:   s.now().UnixMicro() - int64(MaxClockAhead/time.Microsecond),
		fromLive: map[string]struct{}{},
		visited:  map[string]struct{}{},
	}
	in := &dynamodb.ScanInput{
		TableName:              s.table,
		ConsistentRead:         aws.Bool(true),
		FilterExpression:       aws.String("attribute_exists(" + attrGroup + ") OR attribute_exists(" + histGroup + ")"),
		ReturnConsumedCapacity: s.capacityMode(),
	}
	if s.scanLimit > 0 {
		in.Limit = aws.Int32(s.scanLimit)
	}
	for {
		// A page is a read: the client's retryer may send it again.
		out, err := s.client.Scan(ctx, in)
		if err != nil {
			return wrap(ctx, "Scan", err)
		}
		s.observe(out.ConsumedCapacity)
		for _, m := range out.Items {
			if err := u.item(ctx, m); err != nil {
				return err
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// usageScan is the state of one PeriodUsage call.
type usageScan struct {
	s         *Store
	keyPrefix string
	from, to  int64
	fn        func(kvstore.PeriodUsage) error
	recent    int64               // history items written from then on may be new to the Scan
	fromLive  map[string]struct{} // periods reported from group items
	visited   map[string]struct{} // recent history items reported
}

func usageID(group, key string, start int64) string {
	return kvstore.GroupKey(group, key) + "\x00" + fmt.Sprint(start)
}

func (u *usageScan) wants(key string, p period) bool {
	return p.used > 0 && p.start >= u.from && p.start < u.to && strings.HasPrefix(key, u.keyPrefix)
}

func (u *usageScan) report(group, key string, p period) error {
	if err := u.fn(kvstore.PeriodUsage{Group: group, Key: key, Start: p.start, End: p.end, Used: p.used}); err != nil {
		return err
	}
	return nil
}

// item reports the periods of one item of the Scan.
func (u *usageScan) item(ctx context.Context, m map[string]types.AttributeValue) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dynamostore: %w", err)
	}
	pk, ok := m[KeyAttribute].(*types.AttributeValueMemberB)
	if !ok || !bytes.HasPrefix(pk.Value, []byte(u.s.prefix)) {
		return nil
	}
	rest := pk.Value[len(u.s.prefix):]
	switch {
	case bytes.HasPrefix(rest, []byte(historyMark)):
		h, err := parseHistory(m)
		if err != nil || !u.wants(h.key, h.p) {
			return err
		}
		id := usageID(h.group, h.key, h.p.start)
		if _, dup := u.fromLive[id]; dup {
			return nil
		}
		if h.written >= u.recent {
			u.visited[id] = struct{}{}
		}
		return u.report(h.group, h.key, h.p)
	case bytes.HasPrefix(rest, []byte(groupMark)):
		it, err := parseGroup(m)
		if err != nil {
			return err
		}
		return u.group(ctx, string(rest[len(groupMark):]), it)
	}
	return nil
}

// group reports the periods a group item holds: each counter's current
// period, and its ended one while the history's write is pending, unless
// the Scan reports that from the history.
func (u *usageScan) group(ctx context.Context, group string, it groupItem) error {
	for name, rec := range it.recs {
		key, _ := keyOfRec(name)
		if rec.kind != kindCounter {
			continue
		}
		if u.wants(key, rec.cur) {
			u.fromLive[usageID(group, key, rec.cur.start)] = struct{}{}
			if err := u.report(group, key, rec.cur); err != nil {
				return err
			}
		}
		// The ended period: pending, or moved to the history during the
		// call, where the Scan may have passed its place already.
		if !rec.moved || !rec.hasPend && rec.mv < u.recent {
			continue
		}
		if !u.wants(key, period{start: rec.pend.start, used: 1}) {
			continue
		}
		id := usageID(group, key, rec.pend.start)
		_, dup1 := u.visited[id]
		_, dup2 := u.fromLive[id]
		if dup1 || dup2 {
			continue
		}
		raw, err := u.s.readCap(ctx, u.s.historyPK(group, key, rec.pend.start))
		if err != nil {
			return err
		}
		p := rec.pend
		if len(raw) > 0 {
			h, err := parseHistory(raw)
			if err != nil {
				return err
			}
			if h.written < u.recent {
				continue // the Scan reports it from the history
			}
			p = h.p
		} else if !rec.hasPend {
			continue
		}
		if !u.wants(key, p) {
			continue
		}
		u.fromLive[id] = struct{}{}
		if err := u.report(group, key, p); err != nil {
			return err
		}
	}
	return nil
}
