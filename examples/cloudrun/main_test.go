package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/internal/testenv"
)

// testFunctions are registered once, before any server starts (funcframework's
// registry is not safe to write while a server reads it); each test then
// installs the function it built under one of these names.
var testFunctions = map[string]*atomic.Pointer[function]{}

func TestMain(m *testing.M) {
	for _, name := range []string{"QuoteMemory", "QuoteRedisA", "QuoteRedisB", "QuoteFallback", "QuoteOTel"} {
		p := new(atomic.Pointer[function])
		testFunctions[name] = p
		functions.HTTP(name, func(w http.ResponseWriter, r *http.Request) { p.Load().ServeHTTP(w, r) })
	}
	os.Exit(m.Run())
}

// install serves f under name and returns its base URL.
func install(t *testing.T, name string, f *function) string {
	t.Helper()
	testFunctions[name].Store(f)
	return serve(t, name)
}

func suffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// serve runs funcframework on a free loopback port with FUNCTION_TARGET set
// to target, as Cloud Run runs it, and returns the base URL. funcframework
// cannot be stopped, so the server lives until the test binary exits.
func serve(t *testing.T, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	t.Setenv("FUNCTION_TARGET", target)
	errc := make(chan error, 1)
	go func() { errc <- funcframework.StartHostPort("127.0.0.1", strconv.Itoa(port)) }()
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-errc:
			t.Fatalf("funcframework: %v", err)
		default:
		}
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			c.Close()
			return base
		}
		if time.Now().After(deadline) {
			t.Fatal("funcframework did not start in 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type answer struct {
	status int
	header http.Header
	body   string
}

func get(t *testing.T, url string) answer {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(body)}
}

// drain makes the burst of 5 requests and checks that each is admitted with
// the right remaining count, then that the next is denied as the root
// middleware denies.
func drain(t *testing.T, base string) {
	t.Helper()
	for i := 1; i <= 5; i++ {
		a := get(t, base+"/")
		var got struct{ Remaining int64 }
		if a.status != 200 || json.Unmarshal([]byte(a.body), &got) != nil || got.Remaining != int64(5-i) {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
		if p := a.header.Get("RateLimit-Policy"); p != `"quote";q=5;w=10` {
			t.Fatalf("RateLimit-Policy %q", p)
		}
	}
	checkDenied(t, get(t, base+"/"))
}

func checkDenied(t *testing.T, a answer) {
	t.Helper()
	var p httplimit.Problem
	json.Unmarshal([]byte(a.body), &p)
	if a.status != 429 || a.header.Get("Retry-After") != "2" || !strings.HasPrefix(a.header.Get("RateLimit"), `"quote";r=0;t=2`) ||
		a.header.Get("Content-Type") != httplimit.ProblemContentType || p.Type != httplimit.ProblemTypeQuotaExceeded {
		t.Fatalf("6th request: %d %v %s", a.status, a.header, a.body)
	}
}

// The function that init registered is what FUNCTION_TARGET=Quote serves.
func TestRegisteredQuote(t *testing.T) {
	base := serve(t, "Quote")
	a := get(t, base+"/")
	if a.status != 200 || a.header.Get("RateLimit-Policy") != `"quote";q=5;w=10` || !strings.Contains(a.body, "remaining") {
		t.Fatalf("%d %v %s", a.status, a.header, a.body)
	}
}

func TestInMemory(t *testing.T) {
	f, err := newFunction(func(string) string { return "" }, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	drain(t, install(t, "QuoteMemory", f))
}

// Two instances share their buckets through Redis: what one admits, the
// other cannot admit again.
func TestRedisSharedAcrossInstances(t *testing.T) {
	env := map[string]string{
		"REDIS_URL":    "redis://" + testenv.RedisAddr(t) + "/0",
		"REDIS_PREFIX": "ratekit-test-cloudrun-" + suffix() + ":",
	}
	getenv := func(k string) string { return env[k] }
	var bases []string
	for i := 0; i < 2; i++ {
		f, err := newFunction(getenv, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := f.limiter.Reset(context.Background(), "ip:127.0.0.1"); err != nil {
				t.Errorf("cleanup: %v", err)
			}
			f.redis.Close()
		})
		bases = append(bases, install(t, []string{"QuoteRedisA", "QuoteRedisB"}[i], f))
	}
	drain(t, bases[0])
	checkDenied(t, get(t, bases[1]+"/"))
}

// With Redis unreachable each instance falls back to its own buckets: the
// limit still holds per instance.
func TestRedisDownFallsBack(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	var mu sync.Mutex
	decisions := map[string]int{} // "store outcome" -> count
	fallbacks := 0
	var logs syncBuffer
	f, err := newFunction(func(k string) string {
		if k == "REDIS_URL" {
			return "redis://" + dead + "/0"
		}
		return ""
	}, func(strategy, store string) (*ratekit.Observer, error) {
		return &ratekit.Observer{
			Decision: func(_ context.Context, e ratekit.DecisionEvent) {
				mu.Lock()
				defer mu.Unlock()
				decisions[store+" "+e.Outcome.String()]++
			},
			FailurePolicy: func(_ context.Context, e ratekit.FailureEvent) {
				mu.Lock()
				defer mu.Unlock()
				if store == "redis" && e.Action == ratekit.FellBack && e.Policy == policyName {
					fallbacks++
				}
			},
		}, nil
	}, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.redis.Close() })
	drain(t, install(t, "QuoteFallback", f))
	// Every request failed on Redis and was decided by the fallback, and
	// the observers saw each step.
	mu.Lock()
	defer mu.Unlock()
	n := decisions["memory allowed"] + decisions["memory denied"]
	if n == 0 || decisions["redis error"] != n || fallbacks != n || decisions["memory allowed"] != 5 || len(decisions) != 3 || n != 6 {
		t.Fatalf("decisions %v, fallbacks %d", decisions, fallbacks)
	}
	// Six failed requests, one warning: the first failure's, with its
	// cause; the rest are counted for a later line. go-redis's own
	// messages are at level Debug.
	var warnings []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if !strings.Contains(line, `"level":"DEBUG"`) {
			warnings = append(warnings, line)
		}
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], `"msg":"cloudrun: Redis failed; each instance limits with buckets in its own memory until Redis answers again"`) ||
		!strings.Contains(warnings[0], "connection refused") || !strings.Contains(warnings[0], `"action":"fallback"`) {
		t.Fatalf("log of six requests with Redis down:\n%s", logs.String())
	}
}
