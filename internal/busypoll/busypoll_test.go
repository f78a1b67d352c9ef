//go:build unix

package busypoll

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratekit/ratekit/internal/testenv"
)

// pair returns a wrapped client connection of g and the server's end of
// it, over loopback TCP.
func pair(t *testing.T, g *Group) (client net.Conn, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { raw.Close(); s.Close() })
	client = g.Wrap(raw)
	if _, ok := client.(*conn); !ok {
		t.Fatalf("Wrap of a TCP connection returned %T", client)
	}
	return client, s.(*net.TCPConn)
}

// echoAfter reads one byte from s, waits d and writes it back.
func echoAfter(t *testing.T, s net.Conn, d time.Duration) {
	var b [1]byte
	if _, err := io.ReadFull(s, b[:]); err != nil {
		t.Error(err)
		return
	}
	time.Sleep(d)
	if _, err := s.Write(b[:]); err != nil {
		t.Error(err)
	}
}

// roundTrip writes one byte on c and reads its echo, which s sends d
// after it read the byte; with wait, c reads only once the echo was sent
// (its first read then finds it, whatever the scheduler does).
func roundTrip(t *testing.T, c net.Conn, s net.Conn, d time.Duration, wait bool) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); echoAfter(t, s, d) }()
	if _, err := c.Write([]byte{'x'}); err != nil {
		t.Fatal(err)
	}
	if wait {
		<-done
		time.Sleep(time.Millisecond) // loopback delivery
	}
	var b [1]byte
	if n, err := c.Read(b[:]); n != 1 || err != nil || b[0] != 'x' {
		t.Fatalf("Read = %d, %v (%q), want the echo", n, err, b[:n])
	}
	<-done
}

// TestLoneReplyIsCaught: a lone caller's reply that is there when it
// reads, or comes within Spin, is read by the poll (no miss is counted),
// and the wait ends with it.
func TestLoneReplyIsCaught(t *testing.T) {
	var g Group
	c, s := pair(t, &g)
	for range 20 {
		roundTrip(t, c, s, 0, true)
	}
	if m := g.misses.Load(); m != 0 {
		t.Errorf("misses = %d after replies there at the first read, want 0", m)
	}
	if a := g.awaiting.Load(); a != 0 {
		t.Errorf("awaiting = %d after the replies, want 0", a)
	}
	// Replies that come while the caller polls: timing decides whether
	// each is caught, so this only asks that each is read.
	for range 20 {
		roundTrip(t, c, s, 0, false)
	}
}

// TestLateRepliesRest: after Misses replies later than Spin in a row, the
// group parks its next Rest reads at once; the replies are read all the
// same.
func TestLateRepliesRest(t *testing.T) {
	var g Group
	c, s := pair(t, &g)
	for range Misses {
		roundTrip(t, c, s, 3*Spin, false)
	}
	if r := g.rest.Load(); r != Rest {
		t.Fatalf("rest = %d after %d late replies, want %d", r, Misses, Rest)
	}
	roundTrip(t, c, s, 0, true)
	if r := g.rest.Load(); r != Rest-1 {
		t.Errorf("rest = %d after one more read, want %d", r, Rest-1)
	}
}

// TestOnlyALoneCallerPolls: while two connections of a group await
// replies, neither polls.
func TestOnlyALoneCallerPolls(t *testing.T) {
	var g Group
	c1, _ := pair(t, &g)
	c2, _ := pair(t, &g)
	for _, c := range []net.Conn{c1, c2} {
		if _, err := c.Write([]byte{'x'}); err != nil {
			t.Fatal(err)
		}
	}
	if a := g.awaiting.Load(); a != 2 {
		t.Fatalf("awaiting = %d, want 2", a)
	}
	if g.enter() {
		t.Error("a read may poll while two connections await replies")
	}
	c2.Close()
	if a := g.awaiting.Load(); a != 1 {
		t.Fatalf("awaiting = %d after one closed, want 1", a)
	}
	if !g.enter() {
		t.Fatal("a lone caller's read may not poll")
	}
	if g.enter() {
		t.Error("two reads poll at once")
	}
	g.leave(true)
}

// TestPollKeepsDeadlines: a read on a connection that gets no reply
// (silent: no FIN, no RST) fails at its deadline with a timeout, after the
// poll, as an unwrapped connection's does.
func TestPollKeepsDeadlines(t *testing.T) {
	var g Group
	c, _ := pair(t, &g)
	if _, err := c.Write([]byte{'x'}); err != nil {
		t.Fatal(err)
	}
	const deadline = 50 * time.Millisecond
	c.SetReadDeadline(time.Now().Add(deadline))
	start := time.Now()
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read = %v, want a timeout", err)
	}
	if took := time.Since(start); took < deadline || took > deadline+time.Second {
		t.Errorf("Read failed after %v, want about %v", took, deadline)
	}

	// A deadline that passed before the read fails it at once.
	c.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Read past the deadline = %v", err)
	}
}

// TestPollEndsAtTheStreamsEnd: a peer that closed or reset the connection
// before a lone caller's read ends the poll with io.EOF or a read error,
// as an unwrapped connection's read ends, and counts no miss.
func TestPollEndsAtTheStreamsEnd(t *testing.T) {
	t.Run("FIN", func(t *testing.T) {
		var g Group
		c, s := pair(t, &g)
		c.Write([]byte{'x'})
		io.ReadFull(s, make([]byte, 1))
		s.Close()
		time.Sleep(10 * time.Millisecond)
		if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Errorf("Read = %d, %v, want io.EOF", n, err)
		}
		if m := g.misses.Load(); m != 0 {
			t.Errorf("misses = %d, want 0: the poll did not end the read", m)
		}
	})
	t.Run("RST", func(t *testing.T) {
		var g Group
		c, s := pair(t, &g)
		c.Write([]byte{'x'})
		s.SetLinger(0)
		s.Close()
		time.Sleep(10 * time.Millisecond)
		_, err := c.Read(make([]byte, 1))
		var op *net.OpError
		if !errors.As(err, &op) || !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("Read = %v, want a *net.OpError of ECONNRESET", err)
		}
		if m := g.misses.Load(); m != 0 {
			t.Errorf("misses = %d, want 0: the poll did not end the read", m)
		}
	})
}

// TestWrapKeepsTheSocket: the wrapped connection's SyscallConn is the
// socket's (go-redis peeks at it to check an idle connection), and what
// is not a socket is returned as it is.
func TestWrapKeepsTheSocket(t *testing.T) {
	var g Group
	c, _ := pair(t, &g)
	sc, ok := c.(syscall.Conn)
	if !ok {
		t.Fatal("the wrapped connection has no SyscallConn")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Control(func(uintptr) {}); err != nil {
		t.Error(err)
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if w := g.Wrap(p1); w != p1 {
		t.Errorf("Wrap(net.Pipe) = %T, want the pipe itself", w)
	}
}

// TestConcurrentCallers: callers on connections of one group, some lone
// for a while and some together, all read their own replies (run with
// -race), and no connection is left counted as awaiting.
func TestConcurrentCallers(t *testing.T) {
	var g Group
	var wg sync.WaitGroup
	for i := range 4 {
		c, s := pair(t, &g)
		wg.Add(2)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64)
			for {
				n, err := s.Read(buf)
				if err != nil {
					return
				}
				s.Write(buf[:n])
			}
		}()
		go func() {
			defer wg.Done()
			defer c.Close()
			for j := range 200 {
				msg := []byte{byte(i), byte(j)}
				if _, err := c.Write(msg); err != nil {
					t.Error(err)
					return
				}
				got := make([]byte, 2)
				if _, err := io.ReadFull(c, got); err != nil || got[0] != msg[0] || got[1] != msg[1] {
					t.Errorf("caller %d: read %v, %v, want %v", i, got, err, msg)
					return
				}
				if j%50 == 0 {
					time.Sleep(time.Duration(i) * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	if a := g.awaiting.Load(); a != 0 {
		t.Errorf("awaiting = %d after every caller closed, want 0", a)
	}
	if g.polling.Load() {
		t.Error("a poll's place is still taken")
	}
}

// TestDialTLS: DialTLS shakes hands over a polled socket, names the host
// of the address when the config names none, and closes the socket when
// the handshake fails.
func TestDialTLS(t *testing.T) {
	cert, pool := testenv.SelfSigned(t, "127.0.0.1")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	var g Group
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := g.DialTLS(context.Background(), d, "tcp", ln.Addr().String(), &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc, ok := c.(*tls.Conn)
	if !ok {
		t.Fatalf("DialTLS returned %T", c)
	}
	if _, ok := tc.NetConn().(*conn); !ok {
		t.Errorf("the TLS connection runs over %T, not a polled socket", tc.NetConn())
	}
	for range 10 {
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4)
		if _, err := io.ReadFull(c, got); err != nil || string(got) != "ping" {
			t.Fatalf("read %q, %v", got, err)
		}
	}

	// A certificate for another name fails the handshake, and the
	// connection it closes awaits nothing: a lone caller of the group
	// still polls.
	c.Close()
	if _, err := g.DialTLS(context.Background(), d, "tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "example.com"}); err == nil {
		t.Error("DialTLS verified a certificate for 127.0.0.1 as example.com")
	}
	if a := g.awaiting.Load(); a != 0 {
		t.Errorf("awaiting = %d after a failed handshake, want 0", a)
	}
	if _, err := g.DialTLS(context.Background(), d, "tcp", "127.0.0.1:1", &tls.Config{RootCAs: pool}); err == nil {
		t.Error("DialTLS to a closed port succeeded")
	}
}

// TestPollAllocatesNothing: a lone caller's polled round trip allocates
// nothing (a decision's allocations are counted against a bare command's).
func TestPollAllocatesNothing(t *testing.T) {
	var g Group
	c, s := pair(t, &g)
	sent := make(chan struct{})
	go func() {
		buf := make([]byte, 1)
		for {
			if _, err := s.Read(buf); err != nil {
				return
			}
			if _, err := s.Write(buf); err != nil {
				return
			}
			sent <- struct{}{}
		}
	}()
	msg, buf := []byte{'x'}, make([]byte, 1)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		<-sent // the reply is there at the poll's first read
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("a polled round trip allocates %v times, want 0", allocs)
	}
	if m, r := g.misses.Load(), g.rest.Load(); m != 0 || r != 0 {
		t.Errorf("misses %d, rest %d: not every reply was read by a poll", m, r)
	}
}
