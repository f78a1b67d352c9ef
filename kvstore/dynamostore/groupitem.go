package dynamostore

import (
	"fmt"
	"math/big"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratekit/ratekit/kvstore"
)

// groupItem is a group's item as this package reads it.
type groupItem struct {
	present bool
	version int64
	written int64 // the writer's clock at the last decision, µs
	ttl     int64 // the Time to Live attribute, seconds
	recs    map[string]groupRec
	ids     map[string]idRec // idempotency records, by attribute name
}

const (
	kindBucket  = 1
	kindCounter = 2
)

// groupRec is one record of a group item: a token bucket (x, r, t, e) or a
// period counter (its current period and, between a move to a later period
// and the history's write, the ended one).
type groupRec struct {
	kind int
	// A bucket: the line x (level at T is T×r − x, capped), the rate r,
	// the time t of the last write and the expiry e, µs.
	x       *big.Int
	r, t, e int64
	// A counter.
	cur, pend period
	hasPend   bool
}

// period is a counter's count in one period [start, end).
type period struct {
	start, end, used int64
}

// maxDigits bounds the digits of a bucket's x: a time in microseconds
// (below 2^63) times a rate (at most 2^52) has at most 35.
const maxDigits = 38

// maxXBits bounds a bucket's x: a time in microseconds (below 2^63) times a
// rate (at most 2^52), plus a Burst.
const maxXBits = 116

// view returns the record a bucket stands for, for kvstore.Refill.Apply at
// now: on the line when written with r's rate (fewer units than at its
// write when read before it, never more), else its level at its last
// write.
func (g groupRec) view(r kvstore.Refill, now int64) kvstore.Record {
	if g.kind != kindBucket {
		return kvstore.Record{}
	}
	at, rate := now, r.Rate
	if g.r != r.Rate {
		at, rate = g.t, g.r
	}
	lvl := new(big.Int).Mul(big.NewInt(at), big.NewInt(rate))
	lvl.Sub(lvl, g.x)
	switch {
	case lvl.Cmp(big.NewInt(r.Burst)) >= 0:
		return kvstore.Record{Value: r.Burst, Time: at}
	case lvl.Sign() < 0:
		return kvstore.Record{Value: -1, Time: at}
	}
	return kvstore.Record{Value: lvl.Int64(), Time: at}
}

// level returns the bucket's level at now under r.
func (g groupRec) level(r kvstore.Refill, now int64) int64 {
	lvl, _ := r.Level(g.view(r, now), true, now)
	return lvl
}

// bucketRec returns the record of a bucket whose level is next.Value at
// next.Time.
func bucketRec(r kvstore.Refill, next kvstore.Record) groupRec {
	x := new(big.Int).Mul(big.NewInt(next.Time), big.NewInt(r.Rate))
	x.Sub(x, big.NewInt(next.Value))
	return groupRec{kind: kindBucket, x: x, r: r.Rate, t: next.Time, e: bucketExpiry(r, next.Time)}
}

// attr returns the record as a map attribute.
func (g groupRec) attr() types.AttributeValue {
	m := map[string]types.AttributeValue{}
	if g.kind == kindBucket {
		m["x"], m["r"], m["t"], m["e"] = bigNum(g.x), num(g.r), num(g.t), num(g.e)
	} else {
		m["s"], m["n"], m["c"] = num(g.cur.start), num(g.cur.end), num(g.cur.used)
		if g.hasPend {
			m["ps"], m["pn"], m["pc"] = num(g.pend.start), num(g.pend.end), num(g.pend.used)
		}
	}
	return &types.AttributeValueMemberM{Value: m}
}

// parseGroup reads a group item (nil or empty: absent). It returns
// kvstore.ErrMalformedRecord for an item that is not a group item this
// package wrote: a plain key's item, an item of another program, an
// attribute it does not know, a number out of range.
func parseGroup(m map[string]types.AttributeValue) (groupItem, error) {
	if len(m) == 0 {
		return groupItem{}, nil
	}
	it := groupItem{present: true, recs: map[string]groupRec{}}
	if g, err := intAttr(m, attrGroup); err != nil || g != 1 {
		return groupItem{}, fmt.Errorf("%w: not a group item of this package", kvstore.ErrMalformedRecord)
	}
	var err error
	if it.version, err = intAttr(m, attrVersion); err != nil {
		return groupItem{}, err
	}
	if it.written, err = intAttr(m, attrWritten); err != nil {
		return groupItem{}, err
	}
	if it.ttl, err = intAttr(m, TTLAttribute); err != nil {
		return groupItem{}, err
	}
	for name, v := range m {
		switch {
		case name == KeyAttribute || name == attrGroup || name == attrVersion || name == attrWritten || name == TTLAttribute:
			continue
		case name[0] == idemUTF8 || name[0] == idemHex:
			id, err := parseIDRec(name, v)
			if err != nil {
				return groupItem{}, err
			}
			if it.ids == nil {
				it.ids = map[string]idRec{}
			}
			it.ids[name] = id
			continue
		}
		if _, ok := keyOfRec(name); !ok {
			return groupItem{}, fmt.Errorf("%w: attribute %q of a group item", kvstore.ErrMalformedRecord, name)
		}
		rec, err := parseRec(v)
		if err != nil {
			return groupItem{}, fmt.Errorf("record %q: %w", name, err)
		}
		it.recs[name] = rec
	}
	return it, nil
}

// parseRec reads one record of a group item.
func parseRec(v types.AttributeValue) (groupRec, error) {
	mv, ok := v.(*types.AttributeValueMemberM)
	if !ok {
		return groupRec{}, fmt.Errorf("%w: a record is not a map", kvstore.ErrMalformedRecord)
	}
	m := mv.Value
	if _, ok := m["x"]; ok {
		return parseBucket(m)
	}
	return parseCounter(m)
}

func parseBucket(m map[string]types.AttributeValue) (groupRec, error) {
	g := groupRec{kind: kindBucket}
	if len(m) != 4 {
		return groupRec{}, fmt.Errorf("%w: a bucket record has %d fields", kvstore.ErrMalformedRecord, len(m))
	}
	xa, ok := m["x"].(*types.AttributeValueMemberN)
	if !ok || len(xa.Value) > maxDigits+1 {
		return groupRec{}, fmt.Errorf("%w: a bucket's x", kvstore.ErrMalformedRecord)
	}
	var okx bool
	if g.x, okx = new(big.Int).SetString(xa.Value, 10); !okx || g.x.BitLen() > maxXBits {
		return groupRec{}, fmt.Errorf("%w: a bucket's x %q", kvstore.ErrMalformedRecord, xa.Value)
	}
	var err error
	if g.r, err = intAttr(m, "r"); err != nil {
		return groupRec{}, err
	}
	if g.t, err = intAttr(m, "t"); err != nil {
		return groupRec{}, err
	}
	if g.e, err = intAttr(m, "e"); err != nil {
		return groupRec{}, err
	}
	if g.r < 1 || g.r > kvstore.MaxValue {
		return groupRec{}, fmt.Errorf("%w: a bucket's rate %d", kvstore.ErrMalformedRecord, g.r)
	}
	return g, nil
}

func parseCounter(m map[string]types.AttributeValue) (groupRec, error) {
	g := groupRec{kind: kindCounter}
	var err error
	if g.cur, err = parsePeriod(m, "s", "n", "c"); err != nil {
		return groupRec{}, err
	}
	switch len(m) {
	case 3:
	case 6:
		if g.pend, err = parsePeriod(m, "ps", "pn", "pc"); err != nil {
			return groupRec{}, err
		}
		g.hasPend = true
	default:
		return groupRec{}, fmt.Errorf("%w: a counter record has %d fields", kvstore.ErrMalformedRecord, len(m))
	}
	return g, nil
}

func parsePeriod(m map[string]types.AttributeValue, s, n, c string) (period, error) {
	var p period
	var err error
	if p.start, err = intAttr(m, s); err != nil {
		return period{}, err
	}
	if p.end, err = intAttr(m, n); err != nil {
		return period{}, err
	}
	if p.used, err = intAttr(m, c); err != nil {
		return period{}, err
	}
	if p.start < 0 || p.end <= p.start || p.end > kvstore.MaxPeriodBound || p.used < 0 {
		return period{}, fmt.Errorf("%w: period [%d, %d) with count %d", kvstore.ErrMalformedRecord, p.start, p.end, p.used)
	}
	return p, nil
}

// int64s formats integers for an attribute holding several.
func int64s(vs ...int64) string {
	b := make([]byte, 0, 20*len(vs))
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, v, 10)
	}
	return string(b)
}
