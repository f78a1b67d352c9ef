//go:build !js

// Package redistest holds what ratekit's Redis tests share: a throwaway
// redis-server that a test may stop, pause and restart without touching the
// shared server, a throwaway Sentinel deployment (master, replica, Sentinel)
// and Redis Cluster. It needs no Redis client library, so every module's
// tests can use it. Every server listens on a free loopback port and is killed when
// its test ends.
package redistest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratekit/ratekit/internal/testenv"
)

// Server is a redis-server process on a free loopback port, killed when the
// test ends.
type Server struct {
	t    *testing.T
	Addr string // host:port
	bin  string
	args []string // arguments after the defaults
	// sentinel, when set, returns the arguments of a Sentinel on port
	// with its files in dir.
	sentinel func(port, dir string) []string
	cmd      *exec.Cmd
}

// Start starts a throwaway redis-server (no persistence). Without the
// binary it skips outside CI and fails in CI, like package testenv.
func Start(t *testing.T) *Server {
	t.Helper()
	return start(t, serverBin(t))
}

// serverBin returns the path of redis-server, or skips (fails in CI).
func serverBin(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if testenv.InCI() {
			t.Fatal("redis-server binary not found; CI must install redis-server")
		}
		t.Skip("redis-server binary not found; install redis-server to run this test")
	}
	return bin
}

// freePort returns a loopback port that nothing listened on a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

func start(t *testing.T, bin string, args ...string) *Server {
	t.Helper()
	s := &Server{t: t, Addr: net.JoinHostPort("127.0.0.1", freePort(t)), bin: bin, args: args}
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// Restart starts the server again after Stop (on the same port, empty), and
// waits until it accepts connections.
func (s *Server) Restart() {
	s.t.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	dir := s.t.TempDir()
	var args []string
	if s.sentinel != nil {
		args = s.sentinel(port, dir)
	} else {
		args = append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--loglevel", "warning", "--dir", dir}, s.args...)
	}
	s.cmd = exec.Command(s.bin, args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if conn, err := net.Dial("tcp", s.Addr); err == nil {
			conn.Close()
			return
		}
	}
	s.t.Fatalf("redis-server did not start on %s", s.Addr)
}

// Stop kills the server (SIGKILL: nothing is flushed, replicated or
// answered after it); calling it again is harmless.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

// Pause stops the server's process (SIGSTOP) without closing its
// connections: clients and Sentinel see a server that answers nothing, as
// behind a network partition. Resume continues it.
func (s *Server) Pause() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatal(err)
	}
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatal(err)
	}
}

// Sentinel is a throwaway Sentinel deployment on loopback: a master, one
// replica of it, and one Sentinel (quorum 1) that monitors the master under
// MasterName, all killed when the test ends.
type Sentinel struct {
	Master, Replica, Sentinel *Server

	// MasterName is the name the Sentinel monitors the master under.
	MasterName string
}

// StartSentinel starts a master, a replica and a Sentinel whose
// down-after-milliseconds is downAfter and failover-timeout failoverTimeout,
// and returns once the replica is in sync and the Sentinel knows it (a
// failover can then promote it). Without redis-server it skips outside CI and
// fails in CI.
func StartSentinel(t *testing.T, downAfter, failoverTimeout time.Duration) *Sentinel {
	t.Helper()
	bin := serverBin(t)
	d := &Sentinel{MasterName: "ratekit"}
	// No delay before a full sync (Redis 7 waits 5s for more replicas).
	d.Master = start(t, bin, "--repl-diskless-sync-delay", "0")
	host, port, _ := net.SplitHostPort(d.Master.Addr)
	d.Replica = start(t, bin, "--replicaof", host, port, "--repl-diskless-sync-delay", "0")
	s := &Server{t: t, Addr: net.JoinHostPort("127.0.0.1", freePort(t)), bin: bin}
	s.sentinel = func(sport, dir string) []string {
		conf := filepath.Join(dir, "sentinel.conf")
		name := d.MasterName
		text := strings.Join([]string{
			"port " + sport,
			"bind 127.0.0.1",
			"dir " + dir,
			"loglevel warning",
			fmt.Sprintf("sentinel monitor %s %s %s 1", name, host, port),
			// Known from the start, not only from the master's next INFO.
			fmt.Sprintf("sentinel known-replica %s %s", name, strings.Replace(d.Replica.Addr, ":", " ", 1)),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", name, downAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s %d", name, failoverTimeout.Milliseconds()),
		}, "\n") + "\n"
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{conf, "--sentinel"}
	}
	s.Restart()
	t.Cleanup(s.Stop)
	d.Sentinel = s

	cli := cliBin(t)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		info := command(cli, d.Replica.Addr, "INFO", "replication")
		replicas := command(cli, s.Addr, "SENTINEL", "REPLICAS", d.MasterName)
		// redis-cli prints a reply's fields one a line: name, value, ….
		known := strings.Contains(replicas, "name\n"+d.Replica.Addr+"\n") &&
			strings.Contains(replicas, "flags\nslave\n") &&
			strings.Contains(replicas, "master-link-status\nok\n")
		if known && strings.Contains(info, "master_link_status:up") {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: the replica is not in sync or not known to the Sentinel after 30s: %q, %v", info, replicas)
		}
	}
}

// Cluster is a throwaway Redis Cluster of masters only, killed when the test
// ends.
type Cluster struct {
	Masters []*Server
}

// Addrs returns the masters' addresses, the seeds of a cluster client.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		addrs[i] = m.Addr
	}
	return addrs
}

// StartCluster starts a Redis Cluster of n masters (at least 3, as
// redis-cli requires) and no replicas, the 16384 slots spread over them by
// redis-cli --cluster create, and returns once every node reports the cluster
// ok. Without redis-server and redis-cli it skips outside CI and fails in CI.
func StartCluster(t *testing.T, n int) *Cluster {
	t.Helper()
	bin := serverBin(t)
	cli := cliBin(t)
	c := &Cluster{}
	for range n {
		// The cluster bus listens on a port of its own, chosen free too.
		c.Masters = append(c.Masters, start(t, bin, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", freePort(t), "--cluster-node-timeout", "5000"))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, m := range c.Masters {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			info := command(cli, m.Addr, "CLUSTER", "INFO")
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster node %s not ok after 30s: %q", m.Addr, info)
			}
		}
	}
	return c
}

// cliBin returns the path of redis-cli, or skips (fails in CI).
func cliBin(t *testing.T) string {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		if testenv.InCI() {
			t.Fatal("redis-cli binary not found; CI must install redis-tools")
		}
		t.Skip("redis-cli binary not found; install redis-tools to run this test")
	}
	return cli
}

// command runs one command with redis-cli against the server at addr and
// returns its reply as redis-cli prints it, with \r\n folded to \n; a
// failure (the server not up yet) returns what was printed.
func command(cli, addr string, args ...string) string {
	host, port, _ := net.SplitHostPort(addr)
	out, _ := exec.Command(cli, append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	return strings.ReplaceAll(string(out), "\r\n", "\n")
}

// Prefix returns a key prefix no other test or package uses: the test's name
// (without the braces of a hash tag) and random bytes.
func Prefix(t testing.TB) string {
	b := make([]byte, 6)
	rand.Read(b)
	name := strings.NewReplacer("/", ".", "{", "", "}", "").Replace(t.Name())
	return "ratekit-test:" + name + ":" + hex.EncodeToString(b) + ":"
}
