//go:build !js

package redistest

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit/kvstore"
)

// CutRelay is a loopback relay in front of a Redis server that can lose
// one script's reply: after Cut, the next connection that sends EVALSHA or
// EVAL has it forwarded to the server, and is closed as soon as the server
// replies, before any of the reply reaches the client. Redis has run the
// script; the client sees its connection end.
type CutRelay struct {
	// Addr is the relay's address (host:port) for clients to dial.
	Addr string

	armed atomic.Bool
	cuts  atomic.Int64

	mu    sync.Mutex
	conns []net.Conn // nil once the relay stopped
}

// StartCutRelay starts a relay to upstream (host:port) on a free loopback
// port, stopped with every connection through it when the test ends.
func StartCutRelay(t *testing.T, upstream string) *CutRelay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &CutRelay{Addr: l.Addr().String(), conns: []net.Conn{}}
	var wg sync.WaitGroup
	track := func(cs ...net.Conn) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.conns == nil {
			return false
		}
		r.conns = append(r.conns, cs...)
		return true
	}
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.DialTimeout("tcp", upstream, 5*time.Second)
			if err != nil || !track(c, u) {
				c.Close()
				if u != nil {
					u.Close()
				}
				continue
			}
			wg.Go(func() { r.relay(c, u) })
		}
	})
	t.Cleanup(func() {
		l.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.conns = nil
		r.mu.Unlock()
		wg.Wait()
	})
	return r
}

// Kill closes every connection through the relay, whatever it carries;
// clients reconnect through it.
func (r *CutRelay) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
	if r.conns != nil {
		r.conns = r.conns[:0]
	}
}

// Cut arms the relay to lose the reply of the next script a client sends.
func (r *CutRelay) Cut() { r.armed.Store(true) }

// Cuts returns how many replies the relay has lost.
func (r *CutRelay) Cuts() int64 { return r.cuts.Load() }

// scriptCommands are the commands, as a RESP bulk string in upper case,
// whose reply Cut loses.
var scriptCommands = [][]byte{[]byte("$7\r\nEVALSHA\r\n"), []byte("$4\r\nEVAL\r\n")}

// relay copies between the client c and the server u until either ends,
// or until the server replies to a script that Cut picked.
func (r *CutRelay) relay(c, u net.Conn) {
	var cut atomic.Bool
	done := make(chan struct{})
	defer func() {
		c.Close()
		u.Close()
		<-done
	}()
	go func() {
		defer close(done)
		defer u.Close()
		buf := make([]byte, 64<<10)
		// seen holds the end of what came before, so that a command
		// split between two reads is found.
		var seen []byte
		for {
			n, err := c.Read(buf)
			if n > 0 {
				seen = append(seen, bytes.ToUpper(buf[:n])...)
				script := false
				for _, s := range scriptCommands {
					script = script || bytes.Contains(seen, s)
				}
				if script && r.armed.CompareAndSwap(true, false) {
					cut.Store(true)
				}
				// Keep less than a whole command name, and nothing of
				// one already found.
				if script {
					seen = seen[:0]
				} else {
					seen = append(seen[:0], seen[max(0, len(seen)-12):]...)
				}
				if _, err := u.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := u.Read(buf)
		if n > 0 && cut.Load() {
			// The script ran: lose its reply and end the connection.
			r.cuts.Add(1)
			return
		}
		if n > 0 {
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// CheckLostReplyCountsOnce fails t unless s, a store whose client goes
// through relay, charges a take whose reply relay lost exactly once, for
// a take of one key, a composite take and a take with a period counter,
// and reports the loss as an error or as the decision it made. direct is
// a store on the same server and prefix without the relay, which reads
// what s left.
// cyclomatic: one scenario per kind of take, whose branches are its checks.
func CheckLostReplyCountsOnce(t *testing.T, relay *CutRelay, s, direct Store) {
	t.Helper()
	ctx := context.Background()
	// 1,000 units a millisecond: a take of 10^11 refills in 100 s, so the
	// bucket's charge reads to within the test's own duration.
	r := kvstore.Refill{Burst: 1e12, Rate: 1}
	const n = 1e11
	now := time.Now().UnixMicro()
	period := &kvstore.PeriodBounds{Bounds: [4]int64{now - 3600e6, now - 60e6, now + 3600e6, now + 7200e6}, Quota: 10}
	// A refund of an absent key loads the scripts without the relay, so
	// that the first script through it runs rather than answers NOSCRIPT.
	if _, err := direct.Update(ctx, "load", r, kvstore.OpRefund, 1); err != nil {
		t.Fatal(err)
	}
	if err := direct.UpdateMulti(ctx, "", kvstore.OpRefund, []kvstore.Update{{Key: "load", Refill: r, N: 1}, {Key: "load2", Refill: r, N: 1}}, make([]kvstore.OpResult, 2)); err != nil {
		t.Fatal(err)
	}
	if err := direct.UpdateMulti(ctx, "", kvstore.OpRefund, []kvstore.Update{{Key: "load3", Period: period, N: 1}}, make([]kvstore.OpResult, 1)); err != nil {
		t.Fatal(err)
	}
	// charged returns the units key's bucket lacks: n for one take (less
	// what refilled since), 2n for a take run twice.
	charged := func(key string) int64 {
		t.Helper()
		res, err := direct.Update(ctx, key, r, kvstore.OpPeek, 1)
		if err != nil {
			t.Fatal(err)
		}
		return r.Burst - res.Remaining
	}
	once := func(what string, got int64) {
		t.Helper()
		if got <= n/2 || got > n {
			t.Errorf("%s: the bucket lacks %d units after one take of %d whose reply was lost, want it charged once", what, got, int64(n))
		}
	}
	cuts := relay.Cuts()
	relay.Cut()
	_, err := s.Update(ctx, "one", r, kvstore.OpTake, n)
	t.Logf("a take whose reply was lost: %v", err)
	once("a take", charged("one"))

	relay.Cut()
	err = s.UpdateMulti(ctx, "", kvstore.OpTake, []kvstore.Update{{Key: "a", Refill: r, N: n}, {Key: "b", Refill: r, N: n}}, make([]kvstore.OpResult, 2))
	t.Logf("a composite take whose reply was lost: %v", err)
	once("a composite take, first key", charged("a"))
	once("a composite take, second key", charged("b"))

	relay.Cut()
	err = s.UpdateMulti(ctx, "", kvstore.OpTake, []kvstore.Update{{Key: "pb", Refill: r, N: n}, {Key: "pc", Period: period, N: 1}}, make([]kvstore.OpResult, 2))
	t.Logf("a take with a period counter whose reply was lost: %v", err)
	once("a take with a period counter, its bucket", charged("pb"))
	res := make([]kvstore.OpResult, 1)
	if err := direct.UpdateMulti(ctx, "", kvstore.OpPeek, []kvstore.Update{{Key: "pc", Period: period, N: 1}}, res); err != nil || res[0].Used != 1 {
		t.Errorf("a take of 1 with a period counter whose reply was lost: the counter holds %+v, %v; want 1", res[0], err)
	}
	if got := relay.Cuts() - cuts; got != 3 {
		t.Errorf("the relay lost %d replies, want 3", got)
	}

	// Takes at once, which a store may send together in one pipeline:
	// the cut loses every reply of the connection's last read, and no
	// take may run twice. A take refused before it was sent may not run
	// at all.
	relay.Cut()
	const takers = 16
	var wg sync.WaitGroup
	for i := range takers {
		wg.Go(func() { s.Update(ctx, "many"+strconv.Itoa(i), r, kvstore.OpTake, n) })
	}
	wg.Wait()
	for i := range takers {
		if got := charged("many" + strconv.Itoa(i)); got > n {
			t.Errorf("take %d of %d at once: the bucket lacks %d units after one take of %d", i, takers, got, int64(n))
		}
	}
}

// CheckKilledConnectionsCountOnce fails t unless a period counter that s's
// takes count, while relay kills every connection through it every few
// milliseconds, ends at least at the takes s admitted and at most at those
// plus the takes that returned an error (whose script may have run once):
// no take is counted twice. direct is a store on the same server and
// prefix without the relay.
func CheckKilledConnectionsCountOnce(t *testing.T, relay *CutRelay, s, direct Store) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UnixMicro()
	period := &kvstore.PeriodBounds{Bounds: [4]int64{now - 3600e6, now - 60e6, now + 3600e6, now + 7200e6}, Quota: 1e6}
	stop := make(chan struct{})
	var killer sync.WaitGroup
	killer.Go(func() {
		tick := time.NewTicker(3 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				relay.Kill()
			}
		}
	})
	const workers, takes = 8, 100
	var admitted, failed atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			res := make([]kvstore.OpResult, 1)
			for range takes {
				tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err := s.UpdateMulti(tctx, "", kvstore.OpTake, []kvstore.Update{{Key: "killed", Period: period, N: 1}}, res)
				cancel()
				switch {
				case err != nil:
					failed.Add(1)
				case res[0].OK:
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	killer.Wait()
	res := make([]kvstore.OpResult, 1)
	if err := direct.UpdateMulti(ctx, "", kvstore.OpPeek, []kvstore.Update{{Key: "killed", Period: period, N: 1}}, res); err != nil {
		t.Fatal(err)
	}
	a, f, used := admitted.Load(), failed.Load(), res[0].Used
	t.Logf("connections killed every 3ms: %d takes admitted, %d failed, the counter holds %d", a, f, used)
	if used < a || used > a+f {
		t.Errorf("the counter holds %d after %d admitted takes and %d failed ones, want %d to %d", used, a, f, a, a+f)
	}
}
