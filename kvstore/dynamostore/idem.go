package dynamostore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
)

var _ kvstore.IdempotentMulti = (*Store)(nil)

// idemKeep is the most idempotency records a group item keeps: a write that
// leaves more moves them all to items of their own, so that the group item
// stays small (its size is what a decision's write costs).
const idemKeep = 3

// The attributes of an idempotency record (a map in a group item) and of an
// idempotency item.
const (
	idExpiry  = "x" // when the record may be forgotten, µs
	idAt      = "a" // the Store's clock of the decision, µs
	idResults = "r" // the results, see encodeResults
	idGroup   = "ig"
	idName    = "in"
)

// onceArgs are the idempotency arguments of a call.
type onceArgs struct {
	name     string // the record's attribute name
	takeName string // for a refund, the name of the take with the same id
	exp      int64
	takeAt   int64 // for a refund, the take's decision time; −1 when unknown
	// ids are the idempotency records of the group item after the
	// call's write, for moveIDs.
	ids map[string]idRec
}

// idRec is an idempotency record.
type idRec struct {
	exp, at int64
	results string
}

// idAttrName returns the attribute name of the record of op and id.
func idAttrName(op kvstore.Op, id string) string {
	d := strconv.Itoa(int(op))
	if utf8.ValidString(id) {
		return string(idemUTF8) + d + id
	}
	return string(idemHex) + d + hex.EncodeToString([]byte(id))
}

// UpdateMultiOnce implements [kvstore.IdempotentMulti]. The group item keeps
// the record of id (its op, results and decision time) in the write that
// applies the call, conditioned on the item's version, so a retry that reads
// the item finds either the record or the item before the call. When a
// write leaves more than three records in the item, the call then copies
// each to an item of its own (PutItem, Time to Live ttl) and removes them
// from the group item; a retry reads the group item first and then the
// idempotency item, so it finds a record wherever it is.
//
// An idempotent call is never blind: it reads the group item and the
// idempotency item (two strongly consistent reads) and writes the group item
// once, plus, for one call in four, four PutItems and an UpdateItem. A
// refund whose id is a recorded take's gives nothing back to a counter
// whose current period started after the take's decision. OpPeek is
// UpdateMulti. An empty group is refused with kvstore.ErrInvalidOp.
//
// It returns kvstore.ErrInvalidIdempotency for an id that is empty or
// longer than ratekit.MaxKeyLen bytes, or a ttl outside a second to
// kvstore.MaxIdempotencyTTL, before sending anything, and otherwise
// UpdateMulti's errors.
func (s *Store) UpdateMultiOnce(ctx context.Context, group, id string, ttl time.Duration, op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult) (bool, error) {
	switch {
	case id == "" || len(id) > ratekit.MaxKeyLen:
		return false, fmt.Errorf("dynamostore: %w: id of %d bytes, want 1 to %d", kvstore.ErrInvalidIdempotency, len(id), ratekit.MaxKeyLen)
	case ttl < time.Second || ttl > kvstore.MaxIdempotencyTTL:
		return false, fmt.Errorf("dynamostore: %w: ttl %v, want a second to %v", kvstore.ErrInvalidIdempotency, ttl, kvstore.MaxIdempotencyTTL)
	}
	if op == kvstore.OpPeek {
		return false, s.UpdateMulti(ctx, group, op, updates, results)
	}
	once := &onceArgs{name: idAttrName(op, id), takeAt: -1, exp: int64(ttl / time.Microsecond)}
	if op == kvstore.OpRefund {
		once.takeName = idAttrName(kvstore.OpTake, id)
	}
	return s.updateMulti(ctx, group, op, updates, results, once)
}

// idPK returns the partition key of the idempotency item of a record.
func (s *Store) idPK(group, name string) map[string]types.AttributeValue {
	sum := sha256.Sum256([]byte(kvstore.GroupKey(group, name)))
	b := make([]byte, 0, len(s.prefix)+len(idemMark)+24)
	b = append(append(append(b, s.prefix...), idemMark...), sum[:24]...)
	return map[string]types.AttributeValue{KeyAttribute: &types.AttributeValueMemberB{Value: b}}
}

// findID returns the live record name of the group, from the group item it
// or else its own item.
func (s *Store) findID(ctx context.Context, group, name string, it groupItem, now int64) (idRec, bool, error) {
	if r, ok := it.ids[name]; ok && r.exp > now {
		return r, true, nil
	}
	raw, err := s.readCap(ctx, s.idPK(group, name))
	if err != nil || len(raw) == 0 {
		return idRec{}, false, err
	}
	g, ok1 := raw[idGroup].(*types.AttributeValueMemberB)
	n, ok2 := raw[idName].(*types.AttributeValueMemberB)
	if !ok1 || !ok2 || string(g.Value) != group || string(n.Value) != name {
		return idRec{}, false, fmt.Errorf("%w: an idempotency item of another group or id", kvstore.ErrMalformedRecord)
	}
	r, err := parseIDFields(raw)
	if err != nil || r.exp <= now {
		return idRec{}, false, err
	}
	return r, true, nil
}

// replay looks for the call's record and, when found, writes its results
// and reports true. For a refund it also notes when the take of the same id
// was decided.
func (s *Store) replay(ctx context.Context, c *call, it groupItem, now int64, results []kvstore.OpResult) (bool, error) {
	r, ok, err := s.findID(ctx, c.group, c.once.name, it, now)
	if err != nil {
		return false, err
	}
	if ok {
		return true, decodeResults(r.results, results)
	}
	if c.once.takeName != "" {
		t, ok, err := s.findID(ctx, c.group, c.once.takeName, it, now)
		if err != nil {
			return false, err
		}
		if ok {
			c.once.takeAt = t.at
		}
	}
	return false, nil
}

// onceExpr adds to e the call's record and the removal of expired records,
// and returns until when the item must be kept for them.
func (s *Store) onceExpr(e *exprBuilder, c *call, it groupItem, now int64, results []kvstore.OpResult) int64 {
	rec := idRec{exp: now + c.once.exp, at: now, results: encodeResults(results)}
	e.names["#id"] = c.once.name
	e.values[":id"] = rec.attr()
	e.set = append(e.set, "#id = :id")
	c.once.ids = map[string]idRec{c.once.name: rec}
	need := rec.exp
	j := 0
	for name, r := range it.ids {
		if r.exp <= now {
			a := "#x" + strconv.Itoa(j)
			j++
			e.names[a] = name
			e.remove = append(e.remove, a)
			continue
		}
		c.once.ids[name] = r
		need = max(need, r.exp)
	}
	return need
}

// moveIDs copies the group's idempotency records to items of their own and
// removes them from the group item, when the call's write left more than
// idemKeep. A failure leaves them in the group item, where retries find
// them; the next call moves them.
func (s *Store) moveIDs(ctx context.Context, c *call) {
	if len(c.once.ids) <= idemKeep {
		return
	}
	e := newExpr()
	delete(e.names, "#ttl")
	e.values[":g"] = num(1)
	e.cond = append(e.cond, attrGroup+" = :g")
	j := 0
	for name, r := range c.once.ids {
		item := map[string]types.AttributeValue{
			idGroup:      &types.AttributeValueMemberB{Value: []byte(c.group)},
			idName:       &types.AttributeValueMemberB{Value: []byte(name)},
			idExpiry:     num(r.exp),
			idAt:         num(r.at),
			idResults:    &types.AttributeValueMemberS{Value: r.results},
			TTLAttribute: num(ttlSeconds(r.exp)),
		}
		item[KeyAttribute] = s.idPK(c.group, name)[KeyAttribute]
		out, err := s.client.PutItem(ctx, &dynamodb.PutItemInput{TableName: s.table, Item: item, ReturnConsumedCapacity: s.capacityMode()}, noRetries)
		if err != nil {
			return
		}
		s.observe(out.ConsumedCapacity)
		a := "#x" + strconv.Itoa(j)
		j++
		e.names[a] = name
		e.remove = append(e.remove, a)
	}
	in := e.input(s, c.pk)
	in.ReturnValuesOnConditionCheckFailure = ""
	out, err := s.client.UpdateItem(ctx, in, noRetries)
	if err == nil {
		s.observe(out.ConsumedCapacity)
	}
}

func (r idRec) attr() types.AttributeValue {
	return &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
		idExpiry:  num(r.exp),
		idAt:      num(r.at),
		idResults: &types.AttributeValueMemberS{Value: r.results},
	}}
}

// parseIDRec reads an idempotency record of a group item.
func parseIDRec(name string, v types.AttributeValue) (idRec, error) {
	m, ok := v.(*types.AttributeValueMemberM)
	if !ok || len(m.Value) != 3 || len(name) < 3 {
		return idRec{}, fmt.Errorf("%w: idempotency record %q", kvstore.ErrMalformedRecord, name)
	}
	return parseIDFields(m.Value)
}

func parseIDFields(m map[string]types.AttributeValue) (idRec, error) {
	var r idRec
	var err error
	if r.exp, err = intAttr(m, idExpiry); err != nil {
		return idRec{}, err
	}
	if r.at, err = intAttr(m, idAt); err != nil {
		return idRec{}, err
	}
	s, ok := m[idResults].(*types.AttributeValueMemberS)
	if !ok {
		return idRec{}, fmt.Errorf("%w: idempotency results", kvstore.ErrMalformedRecord)
	}
	r.results = s.Value
	if err := decodeResults(r.results, nil); err != nil {
		return idRec{}, err
	}
	return r, nil
}

// encodeResults writes results as "ok,remaining,used,now,period" per
// result, separated by ";".
func encodeResults(results []kvstore.OpResult) string {
	var b strings.Builder
	for i, r := range results {
		if i > 0 {
			b.WriteByte(';')
		}
		ok := int64(0)
		if r.OK {
			ok = 1
		}
		b.WriteString(int64s(ok, r.Remaining, r.Used, r.Now, int64(r.Period)))
	}
	return b.String()
}

// decodeResults reads encodeResults's text into results, as many as both
// hold (all of them checked; nil results only checks).
func decodeResults(text string, results []kvstore.OpResult) error {
	for i, part := range strings.Split(text, ";") {
		f := strings.Split(part, ",")
		if len(f) != 5 {
			return fmt.Errorf("%w: idempotency results %q", kvstore.ErrMalformedRecord, text)
		}
		var v [5]int64
		for j := range f {
			n, err := strconv.ParseInt(f[j], 10, 64)
			if err != nil {
				return fmt.Errorf("%w: idempotency results %q", kvstore.ErrMalformedRecord, text)
			}
			v[j] = n
		}
		if v[0] < 0 || v[0] > 1 || v[4] < 0 || v[4] > 3 {
			return fmt.Errorf("%w: idempotency results %q", kvstore.ErrMalformedRecord, text)
		}
		if i < len(results) {
			results[i] = kvstore.OpResult{OK: v[0] == 1, Remaining: v[1], Used: v[2], Now: v[3], Period: int(v[4])}
		}
	}
	return nil
}
