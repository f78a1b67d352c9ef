package failover_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratekit/ratekit/internal/testenv"
)

// BinDirEnv names the directory of PostgreSQL's server binaries (initdb,
// pg_ctl, pg_basebackup); empty means the newest /usr/lib/postgresql/*/bin,
// where Debian's packages put them.
const BinDirEnv = "RATEKIT_PG_BINDIR"

// The ports of the primary and of the standby, on 127.0.0.1 only: neither
// is the shared test server's 5432.
const (
	primaryPort = 5441
	standbyPort = 5442
	standbyName = "ratekit_failover_standby"
)

// pair is a primary and a streaming standby made from it with
// pg_basebackup -R, each a cluster of its own in a temporary directory,
// run as the postgres user when the test runs as root (initdb and pg_ctl
// refuse root). Its cleanup stops both servers at once and removes the
// directory, whatever the test's outcome.
type pair struct {
	t       *testing.T
	bin     string
	dir     string
	asUser  bool // run the binaries through runuser -u postgres
	primary string
	standby string
}

// binDir returns the directory of PostgreSQL's server binaries, or skips t
// (fails it in CI) when there is none.
func binDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(BinDirEnv)
	if dir == "" {
		found, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		sort.Slice(found, func(i, j int) bool { return version(found[i]) < version(found[j]) })
		if len(found) > 0 {
			dir = found[len(found)-1]
		}
	}
	for _, name := range []string{"initdb", "pg_ctl", "pg_basebackup"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil || dir == "" {
			msg := fmt.Sprintf("failover: PostgreSQL's server binaries (%s) are not in %q; install PostgreSQL or set %s", name, dir, BinDirEnv)
			if testenv.InCI() {
				t.Fatal(msg)
			}
			t.Skip("skipping, " + msg)
		}
	}
	return dir
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// newPair makes and starts a primary on primaryPort with
// synchronous_standby_names set to sync (empty for asynchronous
// replication) and a standby on standbyPort streaming from it, and waits
// until the standby streams (in the sync state when sync is set).
func newPair(t *testing.T, sync bool) *pair {
	t.Helper()
	for _, port := range []int{primaryPort, standbyPort} {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second); err == nil {
			c.Close()
			t.Fatalf("failover: port %d on 127.0.0.1 is taken; the failover test needs ports %d and %d", port, primaryPort, standbyPort)
		}
	}
	p := &pair{t: t, bin: binDir(t), asUser: os.Geteuid() == 0}
	dir, err := os.MkdirTemp("", "ratekit-failover-")
	if err != nil {
		t.Fatal(err)
	}
	p.dir = dir
	t.Cleanup(p.cleanup)
	if p.asUser {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("failover: running as root, and there is no postgres user to run PostgreSQL as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p.primary = filepath.Join(dir, "primary")
	p.standby = filepath.Join(dir, "standby")

	p.run(120*time.Second, "initdb", "-D", p.primary, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C")
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"port = " + strconv.Itoa(primaryPort),
		"unix_socket_directories = '" + dir + "'",
		// fsync off: an immediate stop is not a power cut, and the WAL the
		// killed server wrote stays in the OS's cache; it spares a loaded
		// machine the flushes.
		"fsync = off",
		"full_page_writes = off",
		"max_connections = 100",
		"shared_buffers = 16MB",
		"wal_keep_size = 64MB",
	}
	if sync {
		conf = append(conf, "synchronous_standby_names = '"+standbyName+"'")
	}
	p.appendConf(p.primary, conf)
	p.run(120*time.Second, "pg_ctl", "-D", p.primary, "-l", filepath.Join(dir, "primary.log"), "-w", "-t", "90", "start")

	p.run(180*time.Second, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primaryPort), "-U", "postgres",
		"-D", p.standby, "-R", "-X", "stream", "--no-sync", "-c", "fast")
	// The standby's name in synchronous_standby_names is its
	// application_name, which a walreceiver takes from cluster_name.
	p.appendConf(p.standby, []string{
		"port = " + strconv.Itoa(standbyPort),
		"cluster_name = '" + standbyName + "'",
		"synchronous_standby_names = ''",
		// A standby cut off by cutStandby stays cut off.
		"wal_retrieve_retry_interval = '10min'",
	})
	p.run(120*time.Second, "pg_ctl", "-D", p.standby, "-l", filepath.Join(dir, "standby.log"), "-w", "-t", "90", "start")

	want := "async"
	if sync {
		want = "sync"
	}
	p.waitFor(90*time.Second, primaryPort, "the standby streaming in state "+want,
		"SELECT count(*) = 1 FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2",
		standbyName, want)
	return p
}

func (p *pair) appendConf(dataDir string, lines []string) {
	p.t.Helper()
	f, err := os.OpenFile(filepath.Join(dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		p.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("\n" + strings.Join(lines, "\n") + "\n"); err != nil {
		p.t.Fatal(err)
	}
}

// command returns the command that runs PostgreSQL binary name with args,
// as the postgres user when the test runs as root.
func (p *pair) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	path := filepath.Join(p.bin, name)
	var cmd *exec.Cmd
	if p.asUser {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGCONNECT_TIMEOUT=10")
	return cmd
}

// run runs a PostgreSQL binary to its end within limit and fails the test,
// with its output and the servers' logs, if it fails.
func (p *pair) run(limit time.Duration, name string, args ...string) {
	p.t.Helper()
	if err := p.try(limit, name, args...); err != nil {
		p.t.Fatalf("failover: %v\n%s", err, p.logs())
	}
}

func (p *pair) try(limit time.Duration, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	out, err := p.command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

func (p *pair) logs() string {
	var b strings.Builder
	for _, name := range []string{"primary.log", "standby.log"} {
		data, _ := os.ReadFile(filepath.Join(p.dir, name))
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		fmt.Fprintf(&b, "--- %s (end)\n%s\n", name, data)
	}
	return b.String()
}

// killPrimary stops the primary at once: pg_ctl stop -m immediate, which
// ends every server process without a checkpoint or a flush, as a crash
// does.
func (p *pair) killPrimary() error {
	return p.try(60*time.Second, "pg_ctl", "-D", p.primary, "-m", "immediate", "-w", "-t", "30", "stop")
}

// cutStandby cuts the standby off from the primary, as a network partition
// or a lagging standby would: the primary refuses replication connections
// from then on and ends the standby's current one. From then on the
// standby receives nothing. It waits until the primary has no standby.
func (p *pair) cutStandby() error {
	hba := filepath.Join(p.primary, "pg_hba.conf")
	data, err := os.ReadFile(hba)
	if err != nil {
		return err
	}
	if err := os.WriteFile(hba, append([]byte("host replication all 127.0.0.1/32 reject\n"), data...), 0o600); err != nil {
		return err
	}
	if err := p.waitUntil(30*time.Second, primaryPort, "reload of pg_hba.conf", "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	return p.waitUntil(30*time.Second, primaryPort, "the end of replication",
		"SELECT count(pg_terminate_backend(pid)) = 0 FROM pg_stat_replication")
}

// promote promotes the standby and waits until it accepts writes.
func (p *pair) promote() {
	p.t.Helper()
	p.run(120*time.Second, "pg_ctl", "-D", p.standby, "-w", "-t", "90", "promote")
}

// waitFor polls query on port until it returns true, for at most limit.
func (p *pair) waitFor(limit time.Duration, port int, what, query string, args ...any) {
	p.t.Helper()
	if err := p.waitUntil(limit, port, what, query, args...); err != nil {
		p.t.Fatalf("%v\n%s", err, p.logs())
	}
}

// waitUntil is waitFor returning an error, for goroutines other than the
// test's.
func (p *pair) waitUntil(limit time.Duration, port int, what, query string, args ...any) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		ok, err := p.queryBool(port, query, args...)
		if err == nil && ok {
			return nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("failover: no %s within %v (last error: %v)", what, limit, last)
}

func (p *pair) queryBool(port int, query string, args ...any) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.url(port))
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	var ok bool
	err = conn.QueryRow(ctx, query, args...).Scan(&ok)
	return ok, err
}

// url is the connection string of one server of the pair.
func (p *pair) url(port int) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=10", port)
}

// multiHostURL is the connection string a client of the pair uses: both
// servers, the first that accepts writes.
func (p *pair) multiHostURL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5&target_session_attrs=read-write",
		primaryPort, standbyPort)
}

// waitReplayed waits until the standby has replayed everything the primary
// has written so far.
func (p *pair) waitReplayed() {
	p.t.Helper()
	ok, err := p.queryLSN(primaryPort)
	if err != nil {
		p.t.Fatalf("failover: primary's WAL position: %v", err)
	}
	p.waitFor(60*time.Second, standbyPort, "replay of the primary's WAL on the standby",
		"SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", ok)
}

func (p *pair) queryLSN(port int) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.url(port))
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var lsn string
	err = conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
	return lsn, err
}

// cleanup stops both servers (immediately: their data is thrown away) and
// removes the directory.
func (p *pair) cleanup() {
	for _, d := range []string{p.primary, p.standby} {
		if d == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "postmaster.pid")); err != nil {
			continue
		}
		if err := p.try(60*time.Second, "pg_ctl", "-D", d, "-m", "immediate", "-w", "-t", "30", "stop"); err != nil {
			p.t.Logf("failover: cleanup: %v", err)
		}
	}
	if err := os.RemoveAll(p.dir); err != nil {
		p.t.Logf("failover: cleanup: %v", err)
	}
}
