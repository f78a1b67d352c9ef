package lambda_test

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	awslambda "github.com/aws/aws-lambda-go/lambda"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/lambda"
	"github.com/ratekit/ratekit/signedwindow"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef-lambda-tests")

// clock is the shared fake clock.
type clock = fakeclock.Clock

func newClock() *clock { return fakeclock.New(time.Date(2026, 11, 22, 6, 10, 11, 0, time.UTC)) }

// window returns a signed-window limiter of limit requests a minute on c.
func window(t testing.TB, limit int64, c *clock) *signedwindow.Limiter {
	t.Helper()
	l, err := signedwindow.New(signedwindow.Config{
		Name:   "api",
		Quota:  limit,
		Window: time.Minute,
		Keys:   []signedwindow.Key{{ID: 1, Secret: testSecret}},
		Now:    c.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func guard(t testing.TB, cfg httplimit.GuardConfig) *httplimit.Guard {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	g, err := httplimit.NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func adapter(t testing.TB, cfg lambda.Config) *lambda.Adapter {
	t.Helper()
	a, err := lambda.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// fixture reads testdata/name and applies patch to its decoded JSON, so that
// tests change a real event shape rather than build one in Go.
func fixture(t testing.TB, name string, patch func(m map[string]any)) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if patch == nil {
		return raw
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	patch(m)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// obj returns m[path[0]][path[1]]…, creating maps on the way.
func obj(m map[string]any, path ...string) map[string]any {
	for _, p := range path {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	return m
}

// invoke runs handler on payload through aws-lambda-go's own JSON path and
// decodes the response into R.
func invoke[R any](t testing.TB, ctx context.Context, handler any, payload []byte) R {
	t.Helper()
	out, err := awslambda.NewHandler(handler).Invoke(ctx, payload)
	if err != nil {
		t.Fatalf("Invoke: %v", err)
	}
	var resp R
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("response %s: %v", out, err)
	}
	return resp
}

// recorder is a Limiter that admits everything and records what it was
// asked, with the context's deadline.
type recorder struct {
	mu       sync.Mutex
	reqs     []ratekit.Request
	deadline time.Time
}

func (r *recorder) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if err := req.Validate(); err != nil {
		return ratekit.Decision{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
	r.deadline, _ = ctx.Deadline()
	p := ratekit.Policy{Name: "rec", Quota: 1000, Window: time.Hour}
	return ratekit.Decision{Allowed: true, Quota: 1000, Remaining: 999, ResetAfter: time.Hour, Policy: p}, nil
}

func (r *recorder) last(t testing.TB) ratekit.Request {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reqs) == 0 {
		t.Fatal("the limiter was not called")
	}
	return r.reqs[len(r.reqs)-1]
}

// counter is an exact in-memory quota per key that never refills.
type counter struct {
	mu    sync.Mutex
	limit int64
	used  map[string]int64
}

func (c *counter) Allow(_ context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if err := req.Validate(); err != nil {
		return ratekit.Decision{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := ratekit.Policy{Name: "count", Quota: c.limit, Window: time.Hour}
	d := ratekit.Decision{Quota: c.limit, Policy: p, ResetAfter: time.Hour}
	if c.used[req.Key]+req.Cost > c.limit {
		d.RetryAfter = time.Hour
		return d, nil
	}
	c.used[req.Key] += req.Cost
	d.Allowed, d.Remaining = true, c.limit-c.used[req.Key]
	return d, nil
}

// failing is a Limiter whose store is down.
type failing struct{}

var errStoreDown = errors.New("store down")

func (failing) Allow(context.Context, ratekit.Request) (ratekit.Decision, error) {
	return ratekit.Decision{}, errStoreDown
}

func problemOf(t testing.TB, body string) httplimit.Problem {
	t.Helper()
	var p httplimit.Problem
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("body %q is not a problem: %v", body, err)
	}
	return p
}

// single reads a header field from a single-value response map, ignoring
// case.
func single(h map[string]string, name string) string {
	for k, v := range h {
		if http.CanonicalHeaderKey(k) == http.CanonicalHeaderKey(name) {
			return v
		}
	}
	return ""
}

func multi(h map[string][]string, name string) []string {
	for k, v := range h {
		if http.CanonicalHeaderKey(k) == http.CanonicalHeaderKey(name) {
			return v
		}
	}
	return nil
}

// stateCookie returns the value of the ratekit_token cookie among Set-Cookie
// lines.
func stateCookie(t testing.TB, lines []string) string {
	t.Helper()
	for _, line := range lines {
		c, err := http.ParseSetCookie(line)
		if err == nil && c.Name == httplimit.DefaultStateCookie {
			if !c.HttpOnly || !c.Secure || c.SameSite != http.SameSiteLaxMode || c.Path != "/" || c.MaxAge != 60 {
				t.Errorf("state cookie attributes: %q", line)
			}
			return c.Value
		}
	}
	return ""
}
