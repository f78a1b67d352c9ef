package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit/httplimit"
)

// syncBuffer is a bytes.Buffer safe for concurrent use: a log.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// TestProgram runs the built program as Cloud Run and a person would.
func TestProgram(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "quote")
	if out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	// Arguments and environment it refuses, and -h.
	for _, tc := range []struct {
		args []string
		env  []string
		code int
		once string // exactly once in the output
		not  string // nowhere in the output
	}{
		{[]string{"-h"}, nil, 0, "Usage: cloudrun", "help requested"},
		{[]string{"-port", "8080"}, nil, 2, "flag provided but not defined: -port", "cloudrun: flag"},
		{[]string{"serve"}, nil, 2, `unexpected argument "serve"`, "cloudrun: unexpected"},
		{nil, []string{"REDIS_URL=redis//oops"}, 1,
			`cloudrun: REDIS_URL "redis//oops" is not a redis:// or rediss:// URL (for example redis://10.0.0.3:6379/0)`, "invalid URL scheme"},
		{nil, []string{"REDIS_URL=redis://user:hunter2@127.0.0.1:6379/zero"}, 1,
			`cloudrun: REDIS_URL "redis://xxxxx@127.0.0.1:6379/zero": `, "hunter2"},
		{nil, []string{"FUNCTION_TARGET=Other"}, 1, `cloudrun: FUNCTION_TARGET is "Other"; this program serves one function, "Quote"`, "serving"},
	} {
		cmd := exec.Command(exe, tc.args...)
		cmd.Env = append([]string{"HOST=127.0.0.1", "PORT=" + freePort(t)}, tc.env...)
		out, err := runFor(cmd, 10*time.Second)
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatalf("%v %v: %v", tc.env, tc.args, err)
		}
		if code != tc.code || strings.Count(out, tc.once) != 1 || strings.Contains(out, tc.not) {
			t.Errorf("%v cloudrun %v: exit %d, want %d with %q once and no %q; output:\n%s", tc.env, tc.args, code, tc.code, tc.once, tc.not, out)
		}
	}

	// Without FUNCTION_TARGET it serves Quote at / and says so, once.
	t.Run("no FUNCTION_TARGET", func(t *testing.T) {
		port := freePort(t)
		p := startProgram(t, exe, "HOST=127.0.0.1", "PORT="+port)
		a := get(t, "http://127.0.0.1:"+port+"/")
		if a.status != 200 || !strings.Contains(a.body, "remaining") {
			t.Fatalf("GET /: %d %s", a.status, a.body)
		}
		lines := p.lines()
		if len(lines) != 1 || !strings.Contains(lines[0], `"msg":"cloudrun: serving function \"Quote\" at / on port `+port+`"`) {
			t.Fatalf("log %q", lines)
		}
	})

	// With Redis down, the requests are decided by the fallback and the log
	// has one line about it, with the cause, not one or two per request.
	t.Run("Redis down", func(t *testing.T) {
		port := freePort(t)
		p := startProgram(t, exe, "HOST=127.0.0.1", "PORT="+port, "FUNCTION_TARGET=Quote", "REDIS_URL=redis://127.0.0.1:"+freePort(t)+"/0")
		for i := 1; i <= 7; i++ {
			if a := get(t, "http://127.0.0.1:"+port+"/"); a.status != 200 && (i <= 5 || a.status != 429) {
				t.Fatalf("request %d: %d %s", i, a.status, a.body)
			}
		}
		time.Sleep(100 * time.Millisecond)
		lines := p.lines()
		if len(lines) != 2 || !strings.Contains(lines[1], "cloudrun: Redis failed") || !strings.Contains(lines[1], "connection refused") {
			t.Fatalf("log of 7 requests with Redis down: %q", lines)
		}
	})
}

// runFor runs cmd and returns its combined output, killing it after d.
func runFor(cmd *exec.Cmd, d time.Duration) (string, error) {
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	timer := time.AfterFunc(d, func() { cmd.Process.Kill() })
	defer timer.Stop()
	err := cmd.Wait()
	return out.String(), err
}

type program struct {
	out syncBuffer
}

// lines returns the lines the program has written, stdout's and stderr's.
func (p *program) lines() []string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(p.out.String()))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// startProgram starts exe with env and waits until it accepts connections
// on its $PORT; it is killed when the test ends.
func startProgram(t *testing.T, exe string, env ...string) *program {
	t.Helper()
	p := &program{}
	cmd := exec.Command(exe)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("program output:\n%s", p.out.String())
		}
	})
	var port string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PORT="); ok {
			port = v
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("the program exited:\n%s", p.out.String())
		default:
		}
		if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("the program did not listen in 10 s:\n%s", p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A failure on every request is logged at once, then counted: at most one
// line per interval, and a new run after a quiet interval is logged at once
// again.
func TestThrottledLog(t *testing.T) {
	var logs syncBuffer
	l := &throttledLog{logger: slog.New(slog.NewJSONHandler(&logs, nil)), every: 300 * time.Millisecond, first: "first", summary: "summary"}
	lines := func() []map[string]any {
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			if line == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatal(err)
			}
			out = append(out, m)
		}
		return out
	}
	ctx := context.Background()
	for i := 1; i <= 50; i++ {
		l.failed(ctx, "error", "cause "+strconv.Itoa(i))
	}
	if got := lines(); len(got) != 1 || got[0]["msg"] != "first" || got[0]["error"] != "cause 1" {
		t.Fatalf("after 50 failures in a row: %v", got)
	}
	time.Sleep(450 * time.Millisecond)
	if got := lines(); len(got) != 2 || got[1]["msg"] != "summary" || got[1]["failures"] != 49.0 || got[1]["error"] != "cause 50" {
		t.Fatalf("after an interval: %v", got)
	}
	time.Sleep(350 * time.Millisecond) // quiet for an interval: the run ended
	l.failed(ctx, "error", "again")
	if got := lines(); len(got) != 3 || got[2]["msg"] != "first" || got[2]["error"] != "again" {
		t.Fatalf("after a quiet interval: %v", got)
	}
}

// A request whose client cannot be told (on Cloud Run, no X-Forwarded-For
// entry) gets a 400 in client words; the reason is in the log, once for a
// run of such requests.
func TestNoClientAddress(t *testing.T) {
	var logs syncBuffer
	f, err := newFunction(func(k string) string {
		if k == "K_SERVICE" {
			return "quote"
		}
		return ""
	}, nil, slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		w := httptest.NewRecorder()
		f.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		body, _ := io.ReadAll(w.Body)
		var p httplimit.Problem
		if w.Code != 400 || w.Header().Get("Content-Type") != httplimit.ProblemContentType || json.Unmarshal(body, &p) != nil ||
			p.Detail != "The server could not tell which address this request comes from, so it cannot serve it. Please try again later." {
			t.Fatalf("%d %s", w.Code, body)
		}
	}
	log := logs.String()
	if strings.Count(log, "\n") != 1 || !strings.Contains(log, "X-Forwarded-For has fewer than 1 entries") || !strings.Contains(log, "TRUSTED_PROXIES") {
		t.Fatalf("log:\n%s", log)
	}
	// With the address, it is served.
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Forwarded-For", "198.51.100.7")
	f.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("with X-Forwarded-For: %d %s", w.Code, w.Body)
	}
}
