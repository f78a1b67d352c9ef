package dynamostore

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratekit/ratekit/kvstore"
)

// fuzzItem builds an item from data: a sequence of attributes, each a
// name-length byte, the name, a type byte and a value-length byte and
// value; a type byte of 'M' opens a map of the following attributes,
// closed by a name length of 0xff.
func fuzzItem(data []byte, depth int) (map[string]types.AttributeValue, []byte) {
	m := map[string]types.AttributeValue{}
	for len(data) >= 1 {
		nl := int(data[0])
		data = data[1:]
		if nl == 0xff || nl > len(data) {
			return m, data
		}
		name := string(data[:nl])
		data = data[nl:]
		if len(data) < 1 {
			return m, data
		}
		typ := data[0]
		data = data[1:]
		if typ == 'M' && depth < 2 {
			var sub map[string]types.AttributeValue
			sub, data = fuzzItem(data, depth+1)
			m[name] = &types.AttributeValueMemberM{Value: sub}
			continue
		}
		if len(data) < 1 {
			return m, data
		}
		vl := min(int(data[0]), len(data)-1)
		v := string(data[1 : 1+vl])
		data = data[1+vl:]
		switch typ {
		case 'N':
			m[name] = &types.AttributeValueMemberN{Value: v}
		case 'B':
			m[name] = &types.AttributeValueMemberB{Value: []byte(v)}
		default:
			m[name] = &types.AttributeValueMemberS{Value: v}
		}
	}
	return m, data
}

// FuzzParseGroup: parseGroup and parseHistory never panic; a group item
// they accept round-trips through attr, and its buckets' views stay in
// range for any refill.
func FuzzParseGroup(f *testing.F) {
	f.Add([]byte("\x01gN\x011\x01wN\x013\x01tN\x015\x03ttlN\x0210\x06kburstM\x01xN\x0599999\x01rN\x011\x01tN\x017\x01eN\x019\xff\x06kmonthM\x01sN\x011\x01nN\x012\x01cN\x013\xff"))
	f.Add([]byte("\x01gN\x011\x01wN\x011\x01tN\x011\x03ttlN\x011\x02i1M\x01xN\x011\x01aN\x011\x01rS\x091,2,3,4,1\xff"))
	f.Add([]byte("\x02hgB\x01g\x02hkB\x01k\x01sN\x011\x01nN\x012\x01cN\x013\x02atN\x011\x03ttlN\x011"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, _ := fuzzItem(data, 0)
		_, _ = parseHistory(m)
		_, _ = parseItem(m)
		it, err := parseGroup(m)
		if err != nil {
			return
		}
		for name, rec := range it.recs {
			back, err := parseRec(rec.attr())
			if err != nil {
				t.Fatalf("record %q: %+v does not parse back: %v", name, rec, err)
			}
			if back.kind != rec.kind || back.cur != rec.cur || back.pend != rec.pend || back.hasPend != rec.hasPend ||
				back.r != rec.r || back.t != rec.t || back.e != rec.e || (rec.x != nil && back.x.Cmp(rec.x) != 0) {
				t.Fatalf("record %q: %+v parses back as %+v", name, rec, back)
			}
			if rec.kind != kindBucket {
				continue
			}
			for _, r := range []kvstore.Refill{{Burst: 1, Rate: 1}, {Burst: kvstore.MaxValue, Rate: kvstore.MaxValue}, {Burst: 10, Rate: rec.r}} {
				v := rec.view(r, 1<<62)
				if v.Value < -1 || v.Value > r.Burst {
					t.Fatalf("view of %+v under %+v = %+v, out of range", rec, r, v)
				}
				_ = rec.level(r, 0)
			}
		}
		for _, id := range it.ids {
			if err := decodeResults(id.results, make([]kvstore.OpResult, 3)); err != nil {
				t.Fatalf("accepted results %q do not decode: %v", id.results, err)
			}
		}
	})
}
