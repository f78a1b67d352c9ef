//go:build !wasip1 && !js

package tcpdial

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"
)

func TestNewSetsUserTimeoutAndKeepalive(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := New(time.Second)
	if !d.KeepAliveConfig.Enable || d.KeepAliveConfig.Idle != Idle || d.Timeout != time.Second {
		t.Fatalf("dialer = %+v", d)
	}
	c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got time.Duration
	var gerr error
	if err := raw.Control(func(fd uintptr) { got, gerr = userTimeout(fd) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	want := UserTimeout
	if runtime.GOOS != "linux" {
		want = 0
	}
	if got != want {
		t.Fatalf("TCP_USER_TIMEOUT = %v, want %v", got, want)
	}
}

func TestNewDialsUnixSockets(t *testing.T) {
	path := t.TempDir() + "/s"
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := New(time.Second).DialContext(context.Background(), "unix", path)
	if err != nil {
		t.Fatalf("dial a unix socket: %v", err)
	}
	c.Close()
}
