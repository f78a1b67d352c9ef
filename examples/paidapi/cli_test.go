package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// buildCommand builds the command once into dir and returns its path.
func buildCommand(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "paidapi")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// outsideLambda is the test's environment without the variables of a
// Lambda runtime, plus extra.
func outsideLambda(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_LAMBDA_RUNTIME_API=") && !strings.HasPrefix(kv, "_LAMBDA_SERVER_PORT=") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// The command line, run as a person runs it: -h succeeds, a mistake is
// reported once and exits 2 naming the flag, and a start without -local
// outside Lambda says what to do.
func TestCommandLine(t *testing.T) {
	bin := buildCommand(t, t.TempDir())
	tests := []struct {
		name   string
		args   []string
		env    []string
		status int
		once   []string // each printed exactly once
		not    []string
	}{
		{name: "help", args: []string{"-h"}, status: 0,
			once: []string{"Usage: paidapi", "  -quota calls\n", "  -local\n", "DATABASE_URL"}, not: []string{"help requested"}},
		{name: "unknown flag", args: []string{"-lokal"}, status: 2,
			once: []string{"flag provided but not defined: -lokal", "Usage: paidapi"}},
		{name: "negative quota", args: []string{"-local", "-quota", "-5"}, status: 2,
			once: []string{`invalid value "-5" for flag -quota: must be from 1 to `}},
		{name: "zero burst", args: []string{"-local", "-burst=0"}, status: 2,
			once: []string{`invalid value "0" for flag -burst: must be from 1 to `}},
		{name: "quota not a number", args: []string{"-quota", "1k"}, status: 2,
			once: []string{`invalid value "1k" for flag -quota: not a whole number`}},
		{name: "bad prefix", args: []string{"-prefix", "my prefix"}, status: 2,
			once: []string{`invalid value "my prefix" for flag -prefix: `}},
		{name: "empty prefix", args: []string{"-prefix="}, status: 2,
			once: []string{`invalid value "" for flag -prefix: `}},
		{name: "bad addr", args: []string{"-local", "-addr", "8080"}, status: 2,
			once: []string{`invalid value "8080" for flag -addr: must be host:port`}},
		{name: "stray argument", args: []string{"-local", "quota=5"}, status: 2,
			once: []string{`paidapi: unexpected argument "quota=5"`}, not: []string{"Usage"}},
		// Outside Lambda without -local: one line saying what to do, before
		// the environment is even looked at.
		{name: "not in Lambda", args: nil, status: 2,
			once: []string{"paidapi: not running in AWS Lambda (AWS_LAMBDA_RUNTIME_API is unset): run with -local to serve on localhost\n"},
			not:  []string{"expected AWS Lambda environment variables", "DATABASE_URL"}},
		{name: "not in Lambda, configured", args: []string{"-quota", "5"}, status: 2,
			env:  []string{"DATABASE_URL=postgres://postgres@127.0.0.1:1/test", "PAIDAPI_KEYS=k"},
			once: []string{"run with -local to serve on localhost"}, not: []string{"expected AWS Lambda environment variables"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, tc.args...)
			cmd.Env = outsideLambda(tc.env...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			status := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				status = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if status != tc.status {
				t.Errorf("exit status %d, want %d", status, tc.status)
			}
			for _, s := range tc.once {
				if n := strings.Count(out.String(), s); n != 1 {
					t.Errorf("%q printed %d times, want once", s, n)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(out.String(), s) {
					t.Errorf("printed %q", s)
				}
			}
			if t.Failed() {
				t.Logf("output:\n%s", out.String())
			}
		})
	}
	// The hint is the whole output: one line.
	cmd := exec.Command(bin)
	cmd.Env = outsideLambda()
	out, _ := cmd.CombinedOutput()
	if strings.Count(string(out), "\n") != 1 {
		t.Errorf("outside Lambda printed %q, want one line", out)
	}
}

// lockedBuffer collects a server's log while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A paidapi whose database is unreachable or misconfigured answers 503
// with Retry-After, and its log says why at once, in one line, however
// many calls fail: the first failure's error, never a line per request.
func TestStoreOutageIsLogged(t *testing.T) {
	tests := []struct {
		name  string
		dsn   func(t *testing.T) string
		cause string // in the logged error
	}{
		{"dead address", func(t *testing.T) string {
			return "postgres://postgres@" + deadAddr(t) + "/test?sslmode=disable"
		}, "connect"},
		{"wrong database", func(t *testing.T) string {
			u, err := url.Parse(pgstoretest.PostgresURL(t))
			if err != nil {
				t.Fatal(err)
			}
			u.Path = "/no_such_database_" + unique(t)[len("paidapi-test-"):]
			return u.String()
		}, "does not exist"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"DATABASE_URL": tc.dsn(t), "PAIDAPI_KEYS": "demo-key"}
			var log lockedBuffer
			ctx, cancel := context.WithCancel(context.Background())
			ready := make(chan string, 1)
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, []string{"-local", "-addr", "127.0.0.1:0", "-prefix", unique(t)},
					func(k string) string { return env[k] }, &log, ready)
			}()
			var addr string
			select {
			case addr = <-ready:
			case err := <-done:
				t.Fatalf("server did not start: %v\n%s", err, log.String())
			}
			client := &http.Client{Timeout: 10 * time.Second}
			const calls = 20
			for i := 0; i < calls; i++ {
				req, _ := http.NewRequest("GET", "http://"+addr+"/v1/quote?symbol=ACME", nil)
				req.Header.Set("X-Api-Key", "demo-key")
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
					t.Fatalf("call %d: %d, Retry-After %q; want 503 with Retry-After", i, resp.StatusCode, resp.Header.Get("Retry-After"))
				}
			}
			client.CloseIdleConnections()
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}

			var listening, failures int
			for line := range strings.Lines(log.String()) {
				var m struct{ Msg, Level, Error, Store, Action string }
				if err := json.Unmarshal([]byte(line), &m); err != nil {
					t.Fatalf("log line %q: %v", line, err)
				}
				switch {
				case m.Msg == "paid API listening":
					listening++
				case strings.HasPrefix(m.Msg, "PostgreSQL failed"):
					failures++
					if m.Level != "ERROR" || !strings.Contains(m.Error, tc.cause) || m.Action != "fail_closed" || !strings.Contains(m.Msg, "503") {
						t.Errorf("failure line %s: want level ERROR, action fail_closed and an error about %q", line, tc.cause)
					}
				default:
					t.Errorf("unexpected log line %s", line)
				}
			}
			if listening != 1 || failures != 1 {
				t.Errorf("%d calls failed; the log has %d failure lines, want 1:\n%s", calls, failures, log.String())
			}
		})
	}
}
