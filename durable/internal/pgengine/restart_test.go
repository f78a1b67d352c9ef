package pgengine_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// pgBinDir holds the PostgreSQL server programs of the CI image (Debian's
// postgresql-15). RATEKIT_PG_BINDIR overrides it.
const pgBinDir = "/usr/lib/postgresql/15/bin"

// throwawayCluster is a PostgreSQL cluster of this test alone, in a
// temporary directory on a free port, so that the test can crash and
// restart it while other packages' tests keep using the shared server.
type throwawayCluster struct {
	t    *testing.T
	dir  string
	port int
	bin  string
	as   string // run the server programs as this user ("" = as ourselves)
}

func newThrowawayCluster(t *testing.T) *throwawayCluster {
	t.Helper()
	bin := os.Getenv("RATEKIT_PG_BINDIR")
	if bin == "" {
		bin = pgBinDir
	}
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		t.Fatalf("this test starts its own PostgreSQL cluster and needs initdb and pg_ctl in %s (set RATEKIT_PG_BINDIR): %v", bin, err)
	}
	c := &throwawayCluster{t: t, bin: bin}
	dir, err := os.MkdirTemp("", "ratekit-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root.
		c.as = "postgres"
		u, err := user.Lookup(c.as)
		if err != nil {
			t.Fatalf("running as root, and there is no postgres user to run the server as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	c.dir = filepath.Join(dir, "data")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	c.run("initdb", "-D", c.dir, "-U", "postgres", "-A", "trust", "--no-sync", "--no-instructions")
	c.start()
	t.Cleanup(func() { c.stop("immediate") })
	return c
}

func (c *throwawayCluster) run(prog string, args ...string) {
	c.t.Helper()
	name := filepath.Join(c.bin, prog)
	var cmd *exec.Cmd
	if c.as != "" {
		quoted := []string{shellQuote(name)}
		for _, a := range args {
			quoted = append(quoted, shellQuote(a))
		}
		cmd = exec.Command("su", c.as, "-s", "/bin/sh", "-c", strings.Join(quoted, " "))
	} else {
		cmd = exec.Command(name, args...)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("%s %v: %v\n%s", prog, args, err, out)
	}
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (c *throwawayCluster) start() {
	c.t.Helper()
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c max_connections=20", c.port)
	c.run("pg_ctl", "-D", c.dir, "-o", opts, "-l", filepath.Join(filepath.Dir(c.dir), "log"), "-w", "start")
}

// stop stops the server; mode "immediate" is a crash: the next start runs
// crash recovery, which empties UNLOGGED tables.
func (c *throwawayCluster) stop(mode string) {
	c.t.Helper()
	c.run("pg_ctl", "-D", c.dir, "-m", mode, "-w", "stop")
}

func (c *throwawayCluster) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// TestServerCrashAndRestart crashes a real server (a throwaway cluster,
// stopped with pg_ctl -m immediate) under a live pool and starts it again:
// decisions fail within their deadline while it is down, the same pool
// recovers, logged counters with synchronous commit keep their state, and
// UNLOGGED counters start afresh, as the Durability documentation says.
func TestServerCrashAndRestart(t *testing.T) {
	cl := newThrowawayCluster(t)
	pool := pgstoretest.Pool(t, cl.url(), 2, "")
	s, err := pgengine.New(pool, pgengine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	logged := newCounter(t, s, pgengine.CounterConfig{Prefix: "billing", Algorithm: ratekit.FixedWindow, Quota: 10, Durability: pgengine.Logged, SynchronousCommit: true})
	unlogged := newCounter(t, s, pgengine.CounterConfig{Prefix: "abuse", Algorithm: ratekit.FixedWindow, Quota: 10, Durability: pgengine.Unlogged})
	for i := 0; i < 3; i++ {
		for _, c := range []*pgengine.Counter{logged, unlogged} {
			if _, err := c.Take(ctx, "k", 1, ""); err != nil {
				t.Fatal(err)
			}
		}
	}

	cl.stop("immediate")
	for i := 0; i < 2; i++ {
		actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		start := time.Now()
		_, err := logged.Take(actx, "k", 1, "")
		cancel()
		if err == nil {
			t.Fatal("decision succeeded while the server was down")
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("decision took %v with a 500 ms deadline", took)
		}
	}
	cl.start()

	take := func(c *pgengine.Counter) pgengine.Outcome {
		t.Helper()
		var lastErr error
		for i := 0; i < 5; i++ {
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			r, err := c.Take(actx, "k", 1, "")
			cancel()
			if err == nil {
				return r
			}
			lastErr = err
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("pool did not recover after the restart: %v", lastErr)
		return pgengine.Outcome{}
	}
	if r := take(logged); r.Remaining != 6 {
		t.Errorf("logged counter after crash: remaining %d, want 6 (3 before, 1 now)", r.Remaining)
	}
	if r := take(unlogged); r.Remaining != 9 {
		t.Errorf("unlogged counter after crash: remaining %d, want 9 (reset by crash recovery)", r.Remaining)
	}
}
