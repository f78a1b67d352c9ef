package httplimit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

var errStoreDown = errors.New("store down")

// okHandler answers 200 with the remaining quota from the request context.
var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	d, ok := DecisionFromContext(r.Context())
	io.WriteString(w, "ok remaining="+strconv.FormatInt(d.Remaining, 10)+" decided="+strconv.FormatBool(ok))
})

func newMiddleware(t *testing.T, cfg MiddlewareConfig) http.Handler {
	t.Helper()
	if cfg.Key == nil {
		cfg.Key = RemoteAddrKey()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	mw, err := Middleware(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw(okHandler)
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func request(remote string) *http.Request {
	r := httptest.NewRequest("POST", "/contact", nil)
	r.RemoteAddr = remote
	return r
}

func TestMiddlewareLimits(t *testing.T) {
	lim := newWindowLimiter("contact-form", 3)
	h := newMiddleware(t, MiddlewareConfig{GuardConfig: GuardConfig{Limiter: lim, OnError: FailClosed}})

	for i := 1; i <= 3; i++ {
		w := serve(h, request("198.51.100.1:1000"))
		if w.Code != 200 {
			t.Fatalf("request %d: status %d, body %s", i, w.Code, w.Body)
		}
		if want := "ok remaining=" + strconv.Itoa(3-i) + " decided=true"; w.Body.String() != want {
			t.Fatalf("request %d: body %q, want %q", i, w.Body, want)
		}
		if got, want := w.Header().Get("RateLimit"), `"contact-form";r=`+strconv.Itoa(3-i)+`;t=43`; got != want {
			t.Fatalf("request %d: RateLimit %q, want %q", i, got, want)
		}
		if w.Header().Get("Retry-After") != "" {
			t.Fatalf("request %d: Retry-After on an allowed request", i)
		}
	}

	w := serve(h, request("198.51.100.1:2000")) // same client, other port
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("4th request: status %d, want 429", w.Code)
	}
	if got := w.Header().Get("Retry-After"); got != "43" {
		t.Fatalf("Retry-After %q, want 43", got)
	}
	if got := w.Header().Get("RateLimit-Policy"); got != `"contact-form";q=3;w=60` {
		t.Fatalf("RateLimit-Policy %q", got)
	}
	if got := w.Header().Get("Content-Type"); got != ProblemContentType {
		t.Fatalf("Content-Type %q", got)
	}
	var p Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Type != ProblemTypeQuotaExceeded || p.Status != 429 {
		t.Fatalf("problem body %s (%v)", w.Body, err)
	}

	if w := serve(h, request("198.51.100.2:1000")); w.Code != 200 {
		t.Fatalf("another client: status %d, want 200", w.Code)
	}
}

func TestMiddlewareFailurePolicies(t *testing.T) {
	down := failingLimiter{err: errStoreDown}
	tests := []struct {
		name       string
		cfg        GuardConfig
		wantStatus int
		wantBody   string
		wantLog    string
	}{
		{
			name:       "fail closed",
			cfg:        GuardConfig{Limiter: down, OnError: FailClosed},
			wantStatus: 503,
			wantBody:   ProblemTypeTemporaryReducedCapacity,
		},
		{
			name:       "fail open lets the request through and logs",
			cfg:        GuardConfig{Limiter: down, OnError: FailOpen},
			wantStatus: 200,
			wantBody:   "ok remaining=0 decided=false",
			wantLog:    "store down",
		},
		{
			name:       "fallback decides",
			cfg:        GuardConfig{Limiter: down, OnError: UseFallback, Fallback: newWindowLimiter("fallback", 5)},
			wantStatus: 200,
			wantBody:   "ok remaining=4 decided=true",
			wantLog:    "decided by the fallback",
		},
		{
			name:       "fallback fails too: closed",
			cfg:        GuardConfig{Limiter: down, OnError: UseFallback, Fallback: failingLimiter{err: errors.New("fallback down")}},
			wantStatus: 503,
			wantBody:   ProblemTypeTemporaryReducedCapacity,
			wantLog:    "fallback down",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			tt.cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			h := newMiddleware(t, MiddlewareConfig{GuardConfig: tt.cfg})
			w := serve(h, request("198.51.100.1:1000"))
			if w.Code != tt.wantStatus || !strings.Contains(w.Body.String(), tt.wantBody) {
				t.Fatalf("got %d %q, want %d containing %q", w.Code, w.Body, tt.wantStatus, tt.wantBody)
			}
			if !strings.Contains(logs.String(), tt.wantLog) {
				t.Fatalf("log %q does not mention %q", logs.String(), tt.wantLog)
			}
			if strings.Contains(logs.String(), "198.51.100.1") {
				t.Fatalf("log leaks the client key: %s", logs.String())
			}
		})
	}
}

func TestMiddlewareBadRequestsNeverFailOpen(t *testing.T) {
	lim := newWindowLimiter("p", 10)
	tests := []struct {
		name string
		cfg  MiddlewareConfig
		req  func() *http.Request
	}{
		{
			name: "no usable client address",
			cfg:  MiddlewareConfig{},
			req:  func() *http.Request { return request("garbage") },
		},
		{
			name: "oversized key from the user's key function",
			cfg: MiddlewareConfig{Key: func(r *http.Request) (string, error) {
				return r.Header.Get("X-User"), nil
			}},
			req: func() *http.Request {
				r := request("198.51.100.1:1")
				r.Header.Set("X-User", strings.Repeat("u", ratekit.MaxKeyLen+1))
				return r
			},
		},
		{
			name: "cost function returns 0",
			cfg:  MiddlewareConfig{Cost: func(*http.Request) int64 { return 0 }},
			req:  func() *http.Request { return request("198.51.100.1:1") },
		},
		{
			name: "cost above the limit",
			cfg:  MiddlewareConfig{Cost: func(*http.Request) int64 { return 11 }},
			req:  func() *http.Request { return request("198.51.100.1:1") },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.GuardConfig = GuardConfig{Limiter: lim, OnError: FailOpen}
			w := serve(newMiddleware(t, tt.cfg), tt.req())
			if w.Code != 400 || w.Header().Get("Content-Type") != ProblemContentType {
				t.Fatalf("status %d %q, want 400 problem+json", w.Code, w.Body)
			}
		})
	}
}

func TestMiddlewareStateTransport(t *testing.T) {
	lim := newWindowLimiter("sw", 10)
	h := newMiddleware(t, MiddlewareConfig{GuardConfig: GuardConfig{Limiter: lim, OnError: FailClosed}})

	// No state sent: none handed back (the echo limiter only extends state).
	w := serve(h, request("198.51.100.1:1"))
	if w.Header().Get(DefaultStateHeader) != "" || len(w.Result().Cookies()) != 0 {
		t.Fatal("state handed back although none was sent")
	}

	// State in the header field.
	r := request("198.51.100.1:1")
	r.Header.Set(DefaultStateHeader, "tok")
	w = serve(h, r)
	if got := w.Header().Get(DefaultStateHeader); got != "tok+" {
		t.Fatalf("state header %q, want tok+", got)
	}
	cookies := w.Result().Cookies()
	if len(cookies) != 1 {
		t.Fatalf("cookies %v", cookies)
	}
	c := cookies[0]
	if c.Name != DefaultStateCookie || c.Value != "tok+" || !c.HttpOnly || !c.Secure || c.SameSite != http.SameSiteLaxMode || c.MaxAge != 60 || c.Path != "/" {
		t.Fatalf("cookie %+v", c)
	}

	// State in the cookie comes back through the cookie.
	r = request("198.51.100.1:1")
	r.AddCookie(&http.Cookie{Name: "other", Value: "x"})
	r.AddCookie(c)
	w = serve(h, r)
	if got := w.Header().Get(DefaultStateHeader); got != "tok++" {
		t.Fatalf("state from cookie: %q, want tok++", got)
	}

	// The header field wins over the cookie.
	r.Header.Set(DefaultStateHeader, "hdr")
	if got := serve(h, r).Header().Get(DefaultStateHeader); got != "hdr+" {
		t.Fatalf("header vs cookie: %q, want hdr+", got)
	}

	// Header-only transport.
	h2 := newMiddleware(t, MiddlewareConfig{GuardConfig: GuardConfig{Limiter: lim, OnError: FailClosed, NoStateCookie: true, StateHeader: "X-Token", InsecureCookie: true}})
	r = request("198.51.100.1:1")
	r.AddCookie(c)
	r.Header.Set("X-Token", "t")
	w = serve(h2, r)
	if got := w.Header().Get("X-Token"); got != "t+" || len(w.Result().Cookies()) != 0 {
		t.Fatalf("header-only: %q, cookies %v", got, w.Result().Cookies())
	}
}

func TestMiddlewareDeniedHandler(t *testing.T) {
	lim := newWindowLimiter("p", 1)
	denied := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := DecisionFromContext(r.Context())
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(429)
		io.WriteString(w, "<p>slow down, retry in "+d.RetryAfter.String()+"</p>")
	})
	h := newMiddleware(t, MiddlewareConfig{GuardConfig: GuardConfig{Limiter: lim, OnError: FailClosed}, Denied: denied})
	serve(h, request("198.51.100.1:1"))
	w := serve(h, request("198.51.100.1:1"))
	if w.Code != 429 || w.Body.String() != "<p>slow down, retry in 42.5s</p>" || w.Header().Get("Content-Type") != "text/html" || w.Header().Get("Retry-After") != "43" {
		t.Fatalf("custom denial: %d %q %v", w.Code, w.Body, w.Header())
	}
}

func TestGuardTimeoutBoundsSlowLimiter(t *testing.T) {
	slow := failingLimiter{delay: time.Minute}
	h := newMiddleware(t, MiddlewareConfig{GuardConfig: GuardConfig{Limiter: slow, OnError: FailClosed, Timeout: 20 * time.Millisecond}})
	start := time.Now()
	w := serve(h, request("198.51.100.1:1"))
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Fatalf("slow limiter held the request %v", elapsed)
	}
	if w.Code != 503 {
		t.Fatalf("status %d, want 503", w.Code)
	}
}

func TestGuardHonoursCallerContext(t *testing.T) {
	g, err := NewGuard(GuardConfig{Limiter: failingLimiter{delay: time.Minute}, OnError: FailClosed, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	res := g.Check(ctx, ratekit.Request{Key: "k", Cost: 1}, http.Header{})
	if res.Status != 503 || !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Fatalf("result %+v", res)
	}
}

func TestNewGuardRejectsInvalidConfig(t *testing.T) {
	lim := newWindowLimiter("p", 1)
	tests := map[string]GuardConfig{
		"no limiter":             {OnError: FailClosed},
		"no failure policy":      {Limiter: lim},
		"unknown failure policy": {Limiter: lim, OnError: 99},
		"fallback without one":   {Limiter: lim, OnError: UseFallback},
		"fallback not asked for": {Limiter: lim, OnError: FailOpen, Fallback: lim},
		"negative timeout":       {Limiter: lim, OnError: FailOpen, Timeout: -1},
		"bad state header name":  {Limiter: lim, OnError: FailOpen, StateHeader: "a b"},
		"bad state cookie name":  {Limiter: lim, OnError: FailOpen, StateCookie: "a;b"},
	}
	for name, cfg := range tests {
		if _, err := NewGuard(cfg); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: NewGuard error = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := Middleware(MiddlewareConfig{GuardConfig: GuardConfig{Limiter: lim, OnError: FailOpen}}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Errorf("Middleware without Key: %v, want ErrInvalidConfig", err)
	}
	if got := FailurePolicy(0).String(); got != "FailurePolicy(0)" {
		t.Errorf("String() = %q", got)
	}
}

func TestMiddlewareRequestInContext(t *testing.T) {
	var seen ratekit.Request
	var ok bool
	mw, err := Middleware(MiddlewareConfig{
		GuardConfig:    GuardConfig{Limiter: newWindowLimiter("p", 10), OnError: FailClosed},
		Key:            RemoteAddrKey(),
		Cost:           func(*http.Request) int64 { return 3 },
		IdempotencyKey: func(r *http.Request) string { return r.Header.Get("Idempotency-Key") },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, ok = RequestFromContext(r.Context())
	}))
	r := request("198.51.100.1:1")
	r.Header.Set("Idempotency-Key", "order-42")
	r.Header.Set(DefaultStateHeader, "tok")
	serve(h, r)
	// The request as charged: its State is the state the decision handed
	// back, which counts this charge, not the one the client sent.
	want := ratekit.Request{Key: "ip:198.51.100.1", Cost: 3, State: "tok+", IdempotencyKey: "order-42"}
	if !ok || !reflect.DeepEqual(seen, want) {
		t.Fatalf("RequestFromContext = %+v, %v; want %+v", seen, ok, want)
	}
	if _, ok := RequestFromContext(context.Background()); ok {
		t.Fatal("RequestFromContext found a request in an empty context")
	}
}
