//go:build !js

package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit/kvstore"
)

// A KeyedStore is a Redis store of ratekit that says under which Redis key
// it keeps a key of the empty group.
type KeyedStore interface {
	Store
	Key(key string) string
}

// ForeignValues are values no ratekit store writes into a bucket's key,
// each one that Lua's tonumber or Go's strconv.ParseInt would take for a
// number, or one just outside a record's range; "hash" stands for a key of
// the hash type.
var ForeignValues = []string{
	"nan", "inf", "-inf", "1.5", "1e3", "0x10", "+5", " 5", "5 ", "05", "-0", "", "-1",
	"9007199254740992", "123456789012345678901234567890", "hash",
}

// CheckForeignValues fails t unless every read path of s (a store on the
// Redis server at addr) reports each of ForeignValues in a bucket's key as
// kvstore.ErrMalformedRecord and leaves the key's value and expiry as they
// were: takes (decrement first, and read first after a refusal), peeks and
// refunds of one key, of two keys together, and of a bucket and a period
// counter together; and the same for a period counter's record holding a
// foreign count or start.
// cyclomatic: one table of cases whose branches are its t.Errorf checks.
func CheckForeignValues(t *testing.T, addr string, s KeyedStore) {
	t.Helper()
	raw := dialRaw(t, addr)
	ctx := context.Background()
	r := kvstore.Refill{Burst: 3e9, Rate: 1} // 1,000 units a millisecond, full in 50 minutes
	now := time.Now().UnixMicro()
	period := &kvstore.PeriodBounds{Bounds: [4]int64{now - 3600e6, now - 60e6, now + 3600e6, now + 7200e6}, Quota: 10}
	seq := 0
	// refuse makes the last take of key, and of key with "other" (a
	// composite), refused ones, so that the next take reads first.
	refuse := func(key string) {
		if _, err := s.Update(ctx, key, r, kvstore.OpTake, r.Burst); err != nil {
			t.Fatalf("exhausting %s: %v", key, err)
		}
		if res, err := s.Update(ctx, key, r, kvstore.OpTake, r.Burst); err != nil || res.OK {
			t.Fatalf("a refused take of %s: %+v, %v", key, res, err)
		}
		u := []kvstore.Update{{Key: key, Refill: r, N: r.Burst}, {Key: key + ":other", Refill: r, N: 1}}
		if err := s.UpdateMulti(ctx, "", kvstore.OpTake, u, make([]kvstore.OpResult, 2)); err != nil {
			t.Fatalf("a refused composite take of %s: %v", key, err)
		}
	}
	type opCase struct {
		name     string
		afterRef bool // the key's last take was refused first
		run      func(key string) error
	}
	one := func(op kvstore.Op) func(string) error {
		return func(key string) error { _, err := s.Update(ctx, key, r, op, 1); return err }
	}
	multi := func(op kvstore.Op, n int64) func(string) error {
		return func(key string) error {
			u := []kvstore.Update{{Key: key, Refill: r, N: n}, {Key: key + ":other", Refill: r, N: 1}}
			return s.UpdateMulti(ctx, "", op, u, make([]kvstore.OpResult, 2))
		}
	}
	second := func(op kvstore.Op) func(string) error {
		return func(key string) error {
			u := []kvstore.Update{{Key: key + ":other", Refill: r, N: 1}, {Key: key, Refill: r, N: 1}}
			return s.UpdateMulti(ctx, "", op, u, make([]kvstore.OpResult, 2))
		}
	}
	withPeriod := func(op kvstore.Op) func(string) error {
		return func(key string) error {
			u := []kvstore.Update{{Key: key, Refill: r, N: 1}, {Key: key + ":period", Period: period, N: 1}}
			return s.UpdateMulti(ctx, "", op, u, make([]kvstore.OpResult, 2))
		}
	}
	ops := []opCase{
		{"take", false, one(kvstore.OpTake)},
		{"take after a refusal", true, one(kvstore.OpTake)},
		{"peek", false, one(kvstore.OpPeek)},
		{"refund", false, one(kvstore.OpRefund)},
		{"composite take", false, multi(kvstore.OpTake, 1)},
		{"composite take after a refusal", true, multi(kvstore.OpTake, r.Burst)},
		{"composite peek", false, multi(kvstore.OpPeek, 1)},
		{"composite refund", false, multi(kvstore.OpRefund, 1)},
		{"composite take, foreign key second", false, second(kvstore.OpTake)},
		{"composite peek, foreign key second", false, second(kvstore.OpPeek)},
		{"period take", false, withPeriod(kvstore.OpTake)},
		{"period peek", false, withPeriod(kvstore.OpPeek)},
		{"period refund", false, withPeriod(kvstore.OpRefund)},
	}
	expireAt := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	check := func(what, key, v string, run func() error) {
		t.Helper()
		if v == "hash" {
			raw.do(t, "DEL", key)
			raw.do(t, "HSET", key, "f", "v")
			raw.do(t, "PEXPIREAT", key, expireAt)
		} else {
			raw.do(t, "SET", key, v, "PXAT", expireAt)
		}
		err := run()
		if !errors.Is(err, kvstore.ErrMalformedRecord) {
			t.Errorf("%s of %q: err = %v, want kvstore.ErrMalformedRecord", what, v, err)
		}
		got := raw.do(t, "TYPE", key)
		if v == "hash" {
			if got != "hash" || raw.do(t, "HGET", key, "f") != "v" {
				t.Errorf("%s of a hash key changed it", what)
			}
		} else if val := raw.do(t, "GET", key); got != "string" || val != v {
			t.Errorf("%s of %q left %s %q", what, v, got, val)
		}
		if at := raw.do(t, "PEXPIRETIME", key); at != expireAt {
			t.Errorf("%s of %q moved its expiry from %s to %s", what, v, expireAt, at)
		}
	}
	for _, v := range ForeignValues {
		for _, op := range ops {
			seq++
			key := "foreign" + strconv.Itoa(seq)
			if op.afterRef {
				refuse(key)
			}
			check(op.name, s.Key(key), v, func() error { return op.run(key) })
		}
	}
	// A period counter's record is a hash of one field, which a foreign
	// hash is not; a string "<count> <start>", both decimal integers, is
	// an older release's record, which a foreign value is not either.
	for _, v := range ForeignValues {
		recs := []string{v + " " + strconv.FormatInt(now, 10), "1 " + v}
		if v == "hash" {
			recs = []string{v}
		}
		for i, rec := range recs {
			for _, op := range []kvstore.Op{kvstore.OpTake, kvstore.OpPeek, kvstore.OpRefund} {
				seq++
				key := "foreign" + strconv.Itoa(seq)
				run := func() error {
					u := []kvstore.Update{{Key: key, Period: period, N: 1}}
					return s.UpdateMulti(ctx, "", op, u, make([]kvstore.OpResult, 1))
				}
				check(fmt.Sprintf("period op %d (record part %d)", op, i), s.Key(key), rec, run)
			}
		}
	}
}

// rawConn sends commands to Redis without a client library.
type rawConn struct {
	c net.Conn
	r *bufio.Reader
}

// dialRaw connects to the Redis server at addr, closing the connection
// when the test ends.
func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("redistest: dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{c: c, r: bufio.NewReader(c)}
}

// do sends one command and returns its reply as text: a status, an
// integer or a bulk string as it is, "(nil)" for a nil reply. An error
// reply or a reply of another kind fails the test.
func (rc *rawConn) do(t *testing.T, args ...string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	rc.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := rc.c.Write([]byte(b.String())); err != nil {
		t.Fatalf("redistest: %v: %v", args, err)
	}
	line, err := rc.r.ReadString('\n')
	if err != nil || len(line) < 3 {
		t.Fatalf("redistest: %v: reply %q, %v", args, line, err)
	}
	line = strings.TrimSuffix(line, "\r\n")
	switch line[0] {
	case '+', ':':
		return line[1:]
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "(nil)"
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rc.r, buf); err != nil {
			t.Fatalf("redistest: %v: %v", args, err)
		}
		return string(buf[:n])
	}
	t.Fatalf("redistest: %v: reply %q", args, line)
	return ""
}
