// Package redistest holds what ratekit's Redis tests share: a throwaway
// redis-server that a test may stop and restart without touching the shared
// server, and a go-redis hook that counts the commands a client sends.
package redistest

import (
	"context"
	"net"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/internal/testenv"
)

// Server is a redis-server process on a free loopback port, killed when the
// test ends.
type Server struct {
	t    *testing.T
	Addr string // host:port
	bin  string
	cmd  *exec.Cmd
}

// Start starts a throwaway redis-server (no persistence). Without the
// binary it skips outside CI and fails in CI, like package testenv.
func Start(t *testing.T) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if testenv.InCI() {
			t.Fatal("redis-server binary not found; CI must install redis-server")
		}
		t.Skip("redis-server binary not found; install redis-server to run this test")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, Addr: l.Addr().String(), bin: bin}
	l.Close()
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// Restart starts the server again after Stop (on the same port, empty), and
// waits until it accepts connections.
func (s *Server) Restart() {
	s.t.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	s.cmd = exec.Command(s.bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--loglevel", "warning", "--dir", s.t.TempDir())
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if conn, err := net.Dial("tcp", s.Addr); err == nil {
			conn.Close()
			return
		}
	}
	s.t.Fatalf("redis-server did not start on %s", s.Addr)
}

// Stop kills the server; calling it again is harmless.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

// CommandCounter is a go-redis hook (client.AddHook) that counts the
// commands a client sends, pipelined ones included.
type CommandCounter struct {
	N         atomic.Int64 // commands
	Pipelined atomic.Int64 // commands sent in pipelines of two or more
}

// DialHook does not count dials.
func (h *CommandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts one command.
func (h *CommandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.N.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts every command of a pipeline.
func (h *CommandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.N.Add(int64(len(cmds)))
		if len(cmds) > 1 {
			h.Pipelined.Add(int64(len(cmds)))
		}
		return next(ctx, cmds)
	}
}
