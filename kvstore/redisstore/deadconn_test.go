package redisstore

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection, the client's
// watched by w.
func tcpPair(t *testing.T, w *watch) (*watchedConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	wc := w.wrap(c)
	t.Cleanup(func() { wc.Close(); s.Close() })
	if _, ok := wc.(syscall.Conn); !ok {
		t.Fatal("a watched TCP connection hides its socket from go-redis's health check")
	}
	return wc.(watchedSysConn).watchedConn, s
}

// unanswered writes a command on c and waits 20 ms for a reply that never
// comes.
func unanswered(t *testing.T, c *watchedConn) {
	t.Helper()
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	var ne net.Error
	if _, err := c.Read(make([]byte, 16)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read = %v, want a timeout", err)
	}
}

func TestUnansweredCommandOnBusyConnTrustsTheOthers(t *testing.T) {
	w := &watch{}
	busy, _ := tcpPair(t, w)
	other, _ := tcpPair(t, w)
	other.lastRead.Add(-int64(time.Hour))
	unanswered(t, busy) // dialled just now: idle far less than inDoubtIdle
	if got := w.before.Load(); got != 0 {
		t.Fatalf("a timeout on a busy connection put connections in doubt (before = %d)", got)
	}
	if other.inDoubt() {
		t.Fatal("an idle connection is in doubt after a timeout on a busy one")
	}
}

func TestUnansweredCommandOnIdleConnPutsSilentOnesInDoubt(t *testing.T) {
	w := &watch{}
	idle, _ := tcpPair(t, w)
	stale, staleServer := tcpPair(t, w)
	answered, answeredServer := tcpPair(t, w)
	idle.lastRead.Add(-int64(2 * inDoubtIdle))
	stale.lastRead.Add(-int64(2 * inDoubtIdle))
	unanswered(t, idle)
	if w.before.Load() == 0 {
		t.Fatal("an unanswered command on a connection idle for 2s put nothing in doubt")
	}

	// A connection silent since before the command is in doubt: the health
	// check fails, and a write is refused with nothing sent.
	if !stale.inDoubt() {
		t.Fatal("a connection silent since before the unanswered command is not in doubt")
	}
	if _, err := (watchedSysConn{stale, nil}).SyscallConn(); !errors.Is(err, errNotSent) {
		t.Fatalf("SyscallConn of a connection in doubt = %v, want errNotSent", err)
	}
	if n, err := stale.Write([]byte("PING\r\n")); n != 0 || !errors.Is(err, errNotSent) {
		t.Fatalf("Write on a connection in doubt = %d, %v; want 0, errNotSent", n, err)
	}
	staleServer.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if n, _ := staleServer.Read(make([]byte, 16)); n != 0 {
		t.Fatalf("a refused write sent %d bytes", n)
	}

	// A connection that received data after the command was sent is not,
	// and neither is one dialled after it.
	if _, err := answeredServer.Write([]byte("+PONG\r\n")); err != nil {
		t.Fatal(err)
	}
	answered.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := answered.Read(make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	if answered.inDoubt() {
		t.Fatal("a connection that received a reply after the unanswered command is in doubt")
	}
	if fresh, _ := tcpPair(t, w); fresh.inDoubt() {
		t.Fatal("a connection dialled after the unanswered command is in doubt")
	}
	// A write in the middle of a command (after its first write) is never
	// refused: part of the command may have been sent.
	if _, err := answered.Write([]byte("PI")); err != nil {
		t.Fatal(err)
	}
	w.distrust(time.Now().UnixNano())
	if _, err := answered.Write([]byte("NG\r\n")); err != nil {
		t.Fatalf("the second write of a command was refused: %v", err)
	}
}
