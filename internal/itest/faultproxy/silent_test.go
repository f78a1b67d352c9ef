package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echo starts a line echo server and returns its address.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
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
	return ln.Addr().String()
}

func roundTrip(c net.Conn, d time.Duration) error {
	c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && line != "ping\n" {
		err = errors.New("echo returned " + line)
	}
	return err
}

func TestRelaySilence(t *testing.T) {
	r := StartRelay(t, echo(t))
	old, err := net.Dial("tcp", r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := roundTrip(old, 5*time.Second); err != nil {
		t.Fatalf("before Silence: %v", err)
	}
	if n := r.Silence(); n != 1 {
		t.Fatalf("Silence silenced %d connections, want 1", n)
	}
	// The silenced connection neither answers nor closes.
	if err := roundTrip(old, 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip on a silenced connection: %v, want a timeout (no reply, no close)", err)
	}
	// New connections work.
	fresh, err := net.Dial("tcp", r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if err := roundTrip(fresh, 5*time.Second); err != nil {
		t.Fatalf("new connection after Silence: %v", err)
	}
	if got := r.Accepted(); got != 2 {
		t.Fatalf("Accepted = %d, want 2", got)
	}
	// Close ends the silenced connection too.
	r.Close()
	old.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := old.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read on a silenced connection after Close: %v, want EOF", err)
	}
}
