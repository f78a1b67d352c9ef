package redisengine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
)

// fakeConn is a Conn that records what the Engine sends and answers from
// its fields.
type fakeConn struct {
	evals   []string // script source prefix and arguments of each Eval
	reads   int
	reply   func(script *Script, keys, args []string) ([]int64, error)
	read    func(keys []string, ttls []int64, values []string) (bool, error)
	values  map[string]string
	setTTL  time.Duration
	cluster bool
}

func (f *fakeConn) Eval(_ context.Context, s *Script, keys, args []string, dst []int64) ([]int64, error) {
	f.evals = append(f.evals, scriptName(s)+" "+strings.Join(keys, ",")+" "+strings.Join(args, ","))
	if f.reply == nil {
		for range keys {
			dst = append(dst, 0)
		}
		return dst, nil
	}
	vals, err := f.reply(s, keys, args)
	return append(dst, vals...), err
}

func (f *fakeConn) Read(_ context.Context, keys []string, ttls []int64, values []string) (bool, error) {
	f.reads++
	if f.read == nil {
		return false, nil
	}
	return f.read(keys, ttls, values)
}

func (f *fakeConn) Get(_ context.Context, key string) (string, bool, error) {
	v, ok := f.values[key]
	return v, ok, nil
}

func (f *fakeConn) Set(_ context.Context, key, value string, ttl time.Duration) error {
	if f.values == nil {
		f.values = map[string]string{}
	}
	f.values[key], f.setTTL = value, ttl
	return nil
}

func (f *fakeConn) Del(_ context.Context, key string) error {
	delete(f.values, key)
	return nil
}

func (f *fakeConn) Partitioned() bool { return f.cluster }

func scriptName(s *Script) string {
	switch s {
	case updateScript:
		return "update"
	case multiScript:
		return "multi"
	case periodScript:
		return "period"
	}
	return "?"
}

func itoa(n int) string { return strconv.Itoa(n) }

func newEngine(t *testing.T, f *fakeConn) *Engine {
	t.Helper()
	e, err := New(f, Config{Name: "teststore", Module: "example.com/teststore", Protocol: protocol, Prefix: "p:"})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestUpdateFlow: a take decrements first; a refused take makes the next
// take of the key read first, which decides a take that does not fit
// without a script; a take that fits after the reads runs the read-first
// script; peeks are decided by the reads alone.
func TestUpdateFlow(t *testing.T) {
	f := &fakeConn{}
	e := newEngine(t, f)
	ctx := context.Background()
	r := kvstore.Refill{Burst: 10, Rate: 1} // 1000 units a millisecond, capped at 10
	level := int64(3)
	f.reply = func(_ *Script, _, args []string) ([]int64, error) {
		n, _ := strconv.ParseInt(args[2], 10, 64)
		if args[3] == "r" {
			level = min(level+n, r.Burst)
			return []int64{level}, nil
		}
		if n > level {
			return []int64{-level - 1}, nil
		}
		if args[3] != "p" {
			level -= n
		}
		return []int64{level}, nil
	}
	// The reads give the level as Level reads it: at a rate of 10 units
	// a millisecond (RateArg caps it at max), a PTTL of one millisecond
	// and a value of w make a debt of 10-w.
	f.read = func(keys []string, ttls []int64, values []string) (bool, error) {
		ttls[0], values[0] = 1, strconv.FormatInt(level, 10)
		return true, nil
	}
	step := func(op kvstore.Op, n int64, want kvstore.OpResult, wantEval string, wantReads int) {
		t.Helper()
		f.evals, f.reads = nil, 0
		got, err := e.Update(ctx, "k", r, op, n)
		if err != nil {
			t.Fatal(err)
		}
		evals := strings.Join(f.evals, ";")
		if got != want || evals != wantEval || f.reads != wantReads {
			t.Fatalf("op %d n %d: %+v, evals %q, %d reads; want %+v, %q, %d", op, n, got, evals, f.reads, want, wantEval, wantReads)
		}
	}
	step(kvstore.OpTake, 2, kvstore.OpResult{OK: true, Remaining: 1}, "update p:{k} 10,10,2,T", 0)
	step(kvstore.OpTake, 2, kvstore.OpResult{OK: false, Remaining: 1}, "update p:{k} 10,10,2,T", 0)
	// Refused: the next take reads first and is decided there.
	step(kvstore.OpTake, 2, kvstore.OpResult{OK: false, Remaining: 1}, "", 1)
	step(kvstore.OpPeek, 1, kvstore.OpResult{OK: true, Remaining: 1}, "", 1)
	// A take that fits after the reads runs the read-first script, and
	// the key goes back to decrementing first.
	step(kvstore.OpTake, 1, kvstore.OpResult{OK: true, Remaining: 0}, "update p:{k} 10,10,1,t", 1)
	step(kvstore.OpRefund, 1, kvstore.OpResult{OK: true, Remaining: 1}, "update p:{k} 10,10,1,r", 0)
	// A Conn that declines the reads leaves the decision to the script.
	f.read = nil
	step(kvstore.OpPeek, 1, kvstore.OpResult{OK: true, Remaining: 1}, "update p:{k} 10,10,1,p", 1)
}

// TestUpdateErrors: the script's error replies become the errors they
// stand for, a reply of another length is an error naming the command,
// and invalid arguments fail before anything is sent.
func TestUpdateErrors(t *testing.T) {
	f := &fakeConn{}
	e := newEngine(t, f)
	ctx := context.Background()
	r := kvstore.Refill{Burst: 10, Rate: 1}
	for _, tc := range []struct {
		reply  []int64
		err    error
		target error
		text   string
	}{
		{nil, errors.New("ERR user script: kvstore: malformed record"), kvstore.ErrMalformedRecord, "kvstore: malformed record"},
		{[]int64{1, 2}, nil, nil, "teststore: EVALSHA: unexpected reply [1 2]"},
		{nil, errors.New("connection refused"), nil, "teststore: EVALSHA: connection refused"},
	} {
		f.reply = func(*Script, []string, []string) ([]int64, error) { return tc.reply, tc.err }
		_, err := e.Update(ctx, "k", r, kvstore.OpTake, 1)
		if err == nil || (tc.target != nil && !errors.Is(err, tc.target)) || err.Error() != tc.text {
			t.Errorf("reply %v, %v: Update: %v, want %q", tc.reply, tc.err, err, tc.text)
		}
	}
	f.evals = nil
	if _, err := e.Update(ctx, "k", kvstore.Refill{}, kvstore.OpTake, 1); !errors.Is(err, kvstore.ErrInvalidRefill) {
		t.Errorf("zero refill: %v, want kvstore.ErrInvalidRefill", err)
	}
	if _, err := e.Update(ctx, "k", r, kvstore.OpTake, 11); !errors.Is(err, kvstore.ErrInvalidOp) {
		t.Errorf("n above max: %v, want kvstore.ErrInvalidOp", err)
	}
	if len(f.evals) != 0 {
		t.Errorf("invalid arguments sent %v", f.evals)
	}
	// A deadline that has passed counts as context.DeadlineExceeded.
	f.reply = func(*Script, []string, []string) ([]int64, error) { return nil, errors.New("i/o timeout") }
	dctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if _, err := e.Update(dctx, "k", r, kvstore.OpTake, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("past deadline: %v, want context.DeadlineExceeded", err)
	}
}

// TestUpdateMulti: the multi-key script gets the op and each key's
// arguments, a call with a period counter runs the period script, and
// duplicate keys and keys of several slots on a partitioned Conn fail
// before anything is sent.
func TestUpdateMulti(t *testing.T) {
	f := &fakeConn{}
	e := newEngine(t, f)
	ctx := context.Background()
	r := kvstore.Refill{Burst: 10, Rate: 1}
	ups := []kvstore.Update{{Key: "a", Refill: r, N: 1}, {Key: "b", Refill: r, N: 2}}
	res := make([]kvstore.OpResult, 2)
	f.reply = func(*Script, []string, []string) ([]int64, error) { return []int64{9, -3}, nil }
	if err := e.UpdateMulti(ctx, "", kvstore.OpTake, ups, res); err != nil {
		t.Fatal(err)
	}
	if want := []kvstore.OpResult{{OK: true, Remaining: 9}, {OK: false, Remaining: 2}}; !slices.Equal(res, want) {
		t.Errorf("results %+v, want %+v", res, want)
	}
	if want := "multi p:{a},p:{b} T,10,10,1,10,10,2"; f.evals[0] != want {
		t.Errorf("sent %q, want %q", f.evals[0], want)
	}
	// Refused: the same keys' next take reads first.
	f.evals = nil
	if err := e.UpdateMulti(ctx, "", kvstore.OpTake, ups, res); err != nil {
		t.Fatal(err)
	}
	if want := "multi p:{a},p:{b} t,10,10,1,10,10,2"; f.reads != 1 || f.evals[0] != want {
		t.Errorf("after a refusal: %d reads, sent %q, want 1 and %q", f.reads, f.evals[0], want)
	}
	f.evals = nil
	f.reply = func(*Script, []string, []string) ([]int64, error) { return []int64{1}, nil }
	if err := e.UpdateMulti(ctx, "", kvstore.OpTake, ups, res); err == nil || !strings.Contains(err.Error(), "teststore: EVALSHA: unexpected reply") {
		t.Errorf("short reply: %v", err)
	}
	f.evals = nil
	dup := []kvstore.Update{ups[0], ups[0]}
	if err := e.UpdateMulti(ctx, "", kvstore.OpTake, dup, res); !errors.Is(err, kvstore.ErrDuplicateKey) {
		t.Errorf("duplicate keys: %v, want kvstore.ErrDuplicateKey", err)
	}
	f.cluster = true
	if err := e.UpdateMulti(ctx, "", kvstore.OpTake, ups, res); !errors.Is(err, kvstore.ErrCrossPartition) {
		t.Errorf("keys of two slots: %v, want kvstore.ErrCrossPartition", err)
	}
	if len(f.evals) != 0 {
		t.Errorf("refused calls sent %v", f.evals)
	}
	f.reply = func(*Script, []string, []string) ([]int64, error) { return []int64{9, 8}, nil }
	if err := e.UpdateMulti(ctx, "g", kvstore.OpTake, ups, res); err != nil {
		t.Errorf("a group on a partitioned Conn: %v", err)
	}
	if want := "multi p:g{1:g}a,p:g{1:g}b T,10,10,1,10,10,2"; len(f.evals) != 1 || f.evals[0] != want {
		t.Errorf("group: sent %q, want %q", f.evals, want)
	}
}

// TestUpdatePeriods: a call with a period counter runs the period script,
// and Redis's clock outside the counter's bounds is ratekit.ErrClockSkew.
func TestUpdatePeriods(t *testing.T) {
	f := &fakeConn{}
	e := newEngine(t, f)
	ctx := context.Background()
	ups := []kvstore.Update{
		{Key: "a", Refill: kvstore.Refill{Burst: 10, Rate: 1}, N: 1},
		{Key: "m", N: 1, Period: &kvstore.PeriodBounds{Bounds: [4]int64{0, 100, 200, 300}, Quota: 5}},
	}
	res := make([]kvstore.OpResult, 2)
	f.reply = func(s *Script, keys, args []string) ([]int64, error) { return []int64{150, 9, 3, 2}, nil }
	if err := e.UpdateMulti(ctx, "", kvstore.OpTake, ups, res); err != nil {
		t.Fatal(err)
	}
	if want := "period p:{a},p:{m} T,b,10,10,1,p,0,100 200,300,60001,5,1"; f.evals[0] != want {
		t.Errorf("sent %q, want %q", f.evals[0], want)
	}
	if res[0] != (kvstore.OpResult{OK: true, Remaining: 9}) || res[1] != (kvstore.OpResult{OK: true, Remaining: 2, Used: 3, Now: 150, Period: 2}) {
		t.Errorf("results %+v", res)
	}
	// A refused take makes the same keys' next take read first, and an
	// admitted one decrement first again.
	for i, step := range []struct {
		reply []int64
		want  string
	}{
		{[]int64{150, 9, 5, -2}, "T"},
		{[]int64{150, 9, 5, -2}, "t"},
		{[]int64{150, 9, 4, 2}, "t"},
		{[]int64{150, 9, 5, 2}, "T"},
	} {
		f.evals = nil
		f.reply = func(*Script, []string, []string) ([]int64, error) { return step.reply, nil }
		if err := e.UpdateMulti(ctx, "", kvstore.OpTake, ups, res); err != nil {
			t.Fatal(err)
		}
		if want := "period p:{a},p:{m} " + step.want + ",b,10,10,1,p,0,100 200,300,60001,5,1"; f.evals[0] != want {
			t.Errorf("take %d: sent %q, want %q", i, f.evals[0], want)
		}
	}
	f.reply = func(*Script, []string, []string) ([]int64, error) {
		return nil, fmt.Errorf("ERR user script: kvstore: clock skew: Redis TIME 400 us is outside [0, 300)")
	}
	err := e.UpdateMulti(ctx, "", kvstore.OpTake, ups, res)
	if !errors.Is(err, ratekit.ErrClockSkew) || !strings.HasPrefix(err.Error(), "teststore: ") || !strings.Contains(err.Error(), "Redis TIME 400 us") {
		t.Errorf("clock outside the bounds: %v, want ratekit.ErrClockSkew with the server's text", err)
	}
}

// TestRecords: Set writes FormatRecord's form with the ttl in whole
// milliseconds, Get reads it back, and a value of another form is
// kvstore.ErrMalformedRecord.
func TestRecords(t *testing.T) {
	f := &fakeConn{}
	e := newEngine(t, f)
	ctx := context.Background()
	if err := e.Set(ctx, "k", kvstore.Record{Value: 3, Time: 7}, 1500*time.Microsecond); err != nil {
		t.Fatal(err)
	}
	if f.values["p:{k}"] != "3 7" || f.setTTL != time.Millisecond {
		t.Errorf("Set wrote %q with ttl %v", f.values["p:{k}"], f.setTTL)
	}
	if rec, ok, err := e.Get(ctx, "k"); err != nil || !ok || rec != (kvstore.Record{Value: 3, Time: 7}) {
		t.Errorf("Get: %+v, %v, %v", rec, ok, err)
	}
	if err := e.Set(ctx, "k", kvstore.Record{}, 0); !errors.Is(err, kvstore.ErrInvalidTTL) {
		t.Errorf("Set with ttl 0: %v, want kvstore.ErrInvalidTTL", err)
	}
	f.values["p:{x}"] = "junk"
	if _, _, err := e.Get(ctx, "x"); !errors.Is(err, kvstore.ErrMalformedRecord) {
		t.Errorf("Get of junk: %v, want kvstore.ErrMalformedRecord", err)
	}
	if err := e.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := e.Get(ctx, "k"); ok || err != nil {
		t.Errorf("Get after Delete: %v, %v", ok, err)
	}
}

// TestUpdateAllocs: a decision allocates nothing in the Engine, whatever
// the op, for one key, for buckets together and with a period counter, on
// a Conn that allocates nothing: the keys and arguments are written into
// a pooled buffer.
func TestUpdateAllocs(t *testing.T) {
	e, err := New(lean{}, Config{Name: "teststore", Protocol: protocol, Prefix: "p:"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := kvstore.Refill{Burst: 1e12, Rate: 1e6}
	period := &kvstore.PeriodBounds{Bounds: [4]int64{1_780_000_000_000_000, 1_782_000_000_000_000, 1_784_000_000_000_000, 1_786_000_000_000_000}, Quota: 1e9}
	buckets := []kvstore.Update{{Key: "burst:k", Refill: r, N: 1}, {Key: "day:k", Refill: kvstore.Refill{Burst: 1e9, Rate: 11}, N: 1}}
	planned := []kvstore.Update{{Key: "b:k", Refill: r, N: 1}, {Key: "p:k", N: 1, Period: period}}
	res := make([]kvstore.OpResult, 2)
	for _, op := range []kvstore.Op{kvstore.OpTake, kvstore.OpPeek, kvstore.OpRefund} {
		for name, f := range map[string]func() error{
			"Update":              func() error { _, err := e.Update(ctx, "key-1234567890", r, op, 1); return err },
			"UpdateMulti":         func() error { return e.UpdateMulti(ctx, "", op, buckets, res) },
			"UpdateMulti grouped": func() error { return e.UpdateMulti(ctx, "customer-42", op, buckets, res) },
			"UpdateMulti periods": func() error { return e.UpdateMulti(ctx, "customer-42", op, planned, res) },
		} {
			if err := f(); err != nil {
				t.Fatalf("%s, op %d: %v", name, op, err)
			}
			if allocs := testing.AllocsPerRun(100, func() { f() }); allocs != 0 {
				t.Errorf("%s, op %d: %v allocations", name, op, allocs)
			}
		}
	}
}

// lean is a Conn that allocates nothing: every key holds 5 units, and a
// period counter's reply is in its second period, at 2 units used.
type lean struct{}

func (lean) Eval(_ context.Context, s *Script, keys, args []string, dst []int64) ([]int64, error) {
	if s == periodScript {
		dst = append(dst, 1_783_000_000_000_000)
		for i := 1; i < len(args); {
			if args[i] == "p" {
				dst = append(dst, 2, 2)
				i += 7
				continue
			}
			dst = append(dst, 5)
			i += 4
		}
		return dst, nil
	}
	for range keys {
		dst = append(dst, 5)
	}
	return dst, nil
}

func (lean) Read(_ context.Context, keys []string, ttls []int64, values []string) (bool, error) {
	for i := range keys {
		ttls[i], values[i] = 1, "5"
	}
	return true, nil
}

func (lean) Get(context.Context, string) (string, bool, error)        { return "", false, nil }
func (lean) Set(context.Context, string, string, time.Duration) error { return nil }
func (lean) Del(context.Context, string) error                        { return nil }
func (lean) Partitioned() bool                                        { return false }

// TestKeptAfterAnError: a Conn may keep the keys and arguments of a call
// that returned an error (a command sent after its caller stopped
// waiting): the Engine's next calls, which write theirs into pooled
// buffers, leave them as they were.
func TestKeptAfterAnError(t *testing.T) {
	f := &fakeConn{}
	e := newEngine(t, f)
	ctx := context.Background()
	r := kvstore.Refill{Burst: 1e12, Rate: 1e6}
	var keptKeys, keptArgs []string
	f.reply = func(_ *Script, keys, args []string) ([]int64, error) {
		if keptKeys == nil {
			keptKeys, keptArgs = keys, args
			return nil, context.DeadlineExceeded
		}
		return []int64{5}, nil
	}
	if _, err := e.Update(ctx, "first-key", r, kvstore.OpTake, 123456); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Update: %v, want context.DeadlineExceeded", err)
	}
	for i := range 100 {
		if _, err := e.Update(ctx, "other-key-"+itoa(i), kvstore.Refill{Burst: 9e11, Rate: 7e5}, kvstore.OpTake, 654321); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"p:{first-key}"}; !slices.Equal(keptKeys, want) {
		t.Errorf("the failed call's keys became %q, want %q", keptKeys, want)
	}
	if want := []string{"1000000000000", "1000000000", "123456", "T"}; !slices.Equal(keptArgs, want) {
		t.Errorf("the failed call's arguments became %q, want %q", keptArgs, want)
	}
}
