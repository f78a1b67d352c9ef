package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/signedwindow"
)

// start runs the contact form on a free loopback port and returns its base
// URL; the server is shut down (and run's result checked) when the test ends.
func start(t *testing.T, args ...string) string {
	t.Helper()
	base, _ := startWithLogs(t, args...)
	return base
}

// startWithLogs is start that also returns the server's log.
func startWithLogs(t *testing.T, args ...string) (string, *syncBuffer) {
	t.Helper()
	env := map[string]string{"PORT": "0", "RATEKIT_SECRET": "0123456789abcdef0123456789abcdef-test"}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	logs := &syncBuffer{}
	go func() {
		done <- run(ctx, append([]string{"-host", "127.0.0.1"}, args...), func(k string) string { return env[k] }, logs, ready)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("server did not start: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("server did not start in 10 s")
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run returned %v after shutdown", err)
		}
	})
	return "http://" + addr, logs
}

// syncBuffer is a bytes.Buffer safe for concurrent use: the server's log.
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

func newClient(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, Timeout: 10 * time.Second}
}

// clientFrom returns a client whose connections come from the loopback
// address local, so that the server keys it apart from 127.0.0.1.
func clientFrom(t *testing.T, local string) *http.Client {
	c := newClient(t)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	c.Transport = &http.Transport{DialContext: d.DialContext}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func post(t *testing.T, c *http.Client, base string, form url.Values, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("POST", base+"/contact", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

func message() url.Values {
	return url.Values{"name": {"Ada"}, "email": {"ada@example.com"}, "message": {"Hello there"}}
}

func TestContactFormLimitsOverHTTP(t *testing.T) {
	base := start(t, "-pow=false")
	c := newClient(t)

	resp, err := c.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), `<span id="remaining">5</span> of 5 messages`) {
		t.Fatalf("GET /: %d\n%s", resp.StatusCode, page)
	}

	for i := 1; i <= 5; i++ {
		resp, body := post(t, c, base, message())
		if resp.StatusCode != 200 {
			t.Fatalf("post %d: %d %s", i, resp.StatusCode, body)
		}
		var got struct{ Remaining int64 }
		if err := json.Unmarshal([]byte(body), &got); err != nil || got.Remaining != int64(5-i) {
			t.Fatalf("post %d: body %s, want remaining %d", i, body, 5-i)
		}
		if rl := resp.Header.Get("RateLimit"); !strings.HasPrefix(rl, `"contact-form";r=`) {
			t.Fatalf("post %d: RateLimit %q", i, rl)
		}
	}

	resp, body := post(t, c, base, message())
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("6th post: %d %s, want 429", resp.StatusCode, body)
	}
	if got := resp.Header.Get("RateLimit-Policy"); got != `"contact-form";q=5;w=60` {
		t.Fatalf("RateLimit-Policy %q", got)
	}
	if got := resp.Header.Get("RateLimit"); !strings.HasPrefix(got, `"contact-form";r=0;t=`) {
		t.Fatalf("RateLimit %q", got)
	}
	if ra := resp.Header.Get("Retry-After"); ra == "" || ra == "0" {
		t.Fatalf("Retry-After %q", ra)
	}
	if ct := resp.Header.Get("Content-Type"); ct != httplimit.ProblemContentType || !strings.Contains(body, "quota-exceeded") {
		t.Fatalf("429 body %s (%s)", body, ct)
	}

	// A browser posting the plain form gets a page, with the same headers.
	resp, body = post(t, c, base, message(), "Accept", "text/html")
	if resp.StatusCode != 429 || !strings.Contains(body, "try again in "+resp.Header.Get("Retry-After")+" seconds") {
		t.Fatalf("HTML denial: %d %s", resp.StatusCode, body)
	}

	// The page shows the count the token carries.
	resp, err = c.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), `<span id="remaining">0</span> of 5`) {
		t.Fatalf("page after the limit:\n%s", page)
	}

	// Dropping the cookie does not help on this instance: the replay cache
	// counts a token-less post from the same address in its window. (On
	// another instance it would start afresh: the documented limit of this
	// strategy; the proof of work makes it expensive.)
	if resp, body := post(t, newClient(t), base, message()); resp.StatusCode != 429 {
		t.Fatalf("same address, no cookie: %d %s, want 429", resp.StatusCode, body)
	}
	// Another address starts at 5.
	other := clientFrom(t, "127.0.0.2")
	if resp, body := post(t, other, base, message()); resp.StatusCode != 200 {
		t.Fatalf("another address: %d %s", resp.StatusCode, body)
	}

	// Invalid input is refused but counted (the post was admitted first).
	bad := message()
	bad.Set("email", "not an address")
	if resp, _ := post(t, other, base, bad); resp.StatusCode != 400 {
		t.Fatalf("bad email: %d, want 400", resp.StatusCode)
	}
}

func TestContactFormProofOfWork(t *testing.T) {
	base := start(t, "-limit", "4", "-trusted-proxies", "1", "-pow-bits", "8")
	c := newClient(t)
	client := []string{"X-Forwarded-For", "198.51.100.7"}

	challenge := func() (string, int) {
		req, _ := http.NewRequest("GET", base+"/challenge", nil)
		req.Header.Set(client[0], client[1])
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got struct {
			Challenge  string
			Difficulty int
		}
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || got.Challenge == "" {
			t.Fatalf("GET /challenge: %v %+v", err, got)
		}
		return got.Challenge, got.Difficulty
	}

	// No solution, no post, and nothing is counted.
	if resp, body := post(t, c, base, message(), client...); resp.StatusCode != 403 {
		t.Fatalf("post without work: %d %s", resp.StatusCode, body)
	}

	// A solution of this client's first challenge, kept for later.
	ch, _ := challenge()
	solution, err := signedwindow.Solve(context.Background(), ch)
	if err != nil {
		t.Fatal(err)
	}
	spare := message()
	spare.Set("pow", solution)

	var difficulties []int
	for i := 1; i <= 4; i++ {
		ch, bits := challenge()
		difficulties = append(difficulties, bits)
		solution, err := signedwindow.Solve(context.Background(), ch)
		if err != nil {
			t.Fatal(err)
		}
		form := message()
		form.Set("pow", solution)
		resp, body := post(t, c, base, form, client...)
		if resp.StatusCode != 200 {
			t.Fatalf("post %d with work: %d %s", i, resp.StatusCode, body)
		}
		if i == 1 {
			// The same solution again is refused by the replay cache.
			if resp, body := post(t, c, base, form, client...); resp.StatusCode != 403 {
				t.Fatalf("reused solution: %d %s", resp.StatusCode, body)
			}
		}
	}
	if !(difficulties[0] < difficulties[3]) {
		t.Fatalf("difficulty did not rise with the count: %v", difficulties)
	}

	// A solution for another client does not work for this one.
	if resp, body := post(t, newClient(t), base, spare, "X-Forwarded-For", "203.0.113.99"); resp.StatusCode != 403 {
		t.Fatalf("other client's solution: %d %s", resp.StatusCode, body)
	}

	// The 5th post of this client, with valid work, is over the limit.
	if resp, body := post(t, c, base, spare, client...); resp.StatusCode != 429 {
		t.Fatalf("5th post: %d %s, want 429", resp.StatusCode, body)
	}
}

// TestContactFormSpentQuota checks what a client whose quota is spent is
// told: no challenge to solve, a 429 at once for a post with or without
// work, and the same seconds in the HTML page as in Retry-After.
func TestContactFormSpentQuota(t *testing.T) {
	base := start(t, "-limit", "2", "-pow-bits", "8")
	c := newClient(t)
	getJSON := func() (got struct {
		Challenge  string
		Remaining  int64
		RetryAfter int64 `json:"retry_after"`
	}) {
		resp, err := c.Get(base + "/challenge")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	for i := 1; i <= 2; i++ {
		ch := getJSON()
		solution, err := signedwindow.Solve(context.Background(), ch.Challenge)
		if err != nil {
			t.Fatal(err)
		}
		form := message()
		form.Set("pow", solution)
		if resp, body := post(t, c, base, form); resp.StatusCode != 200 {
			t.Fatalf("post %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if got := getJSON(); got.Challenge != "" || got.Remaining != 0 || got.RetryAfter < 1 || got.RetryAfter > 60 {
		t.Fatalf("challenge with the quota spent: %+v, want no challenge and the wait", got)
	}
	resp, body := post(t, c, base, message())
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("post without work, quota spent: %d %s, want 429 with Retry-After", resp.StatusCode, body)
	}
	resp, body = post(t, c, base, message(), "Accept", "text/html")
	ra := resp.Header.Get("Retry-After")
	if resp.StatusCode != 429 || !strings.Contains(body, "messages this minute. Please try again in "+ra+" seconds.") {
		t.Fatalf("HTML denial: %d, Retry-After %s:\n%s", resp.StatusCode, ra, body)
	}
	page := get(t, c, base+"/")
	if !strings.Contains(page, "0</span> of 2 messages left this minute.") || !strings.Contains(page, "Please try again in") {
		t.Fatalf("page with the quota spent:\n%s", page)
	}
}

func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// TestContactFormAssets checks the worker script and that the browser's
// favicon request is not a 404.
func TestContactFormAssets(t *testing.T) {
	base := start(t)
	c := newClient(t)
	if js := get(t, c, base+"/pow.js"); !strings.Contains(js, "onmessage") {
		t.Fatalf("/pow.js: %.200s", js)
	}
	resp, err := c.Get(base + "/favicon.ico")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		t.Fatalf("/favicon.ico: %d", resp.StatusCode)
	}
	if page := get(t, c, base+"/"); !strings.Contains(page, `<link rel="icon" href="data:,">`) {
		t.Fatal("the page names no icon, so browsers ask for /favicon.ico")
	}
}

// TestDifficultyCalibration checks the default proof of work against the
// hash rate it is calibrated to: a median under 1 s for a window's first
// post, under 5 s for its last, and a challenge lifetime that covers the
// 99.99th percentile of the hardest solve on a device four times slower.
func TestDifficultyCalibration(t *testing.T) {
	for _, tc := range []struct {
		powTime time.Duration
		limit   int64
	}{{300 * time.Millisecond, 5}, {300 * time.Millisecond, 100}, {50 * time.Millisecond, 5}, {time.Second, 5}} {
		cfg := config{pow: true, powTime: tc.powTime, limit: tc.limit, window: time.Minute}
		p, lifetime := cfg.difficulty()
		median := func(bits int) time.Duration {
			return time.Duration(math.Ln2 * math.Exp2(float64(bits)) / browserHashRate * float64(time.Second))
		}
		first, last := median(p.Bits(0)), median(p.Bits(tc.limit-1))
		slowest := time.Duration(9.2 * math.Exp2(float64(p.Bits(tc.limit-1))) / (browserHashRate / 4) * float64(time.Second))
		t.Logf("-pow-time %v, limit %d: %d to %d bits, medians %v to %v, lifetime %v", tc.powTime, tc.limit, p.Bits(0), p.Bits(tc.limit-1),
			first.Round(time.Millisecond), last.Round(time.Millisecond), lifetime)
		if r := float64(first) / float64(tc.powTime); r < 0.7 || r > 1.42 { // the nearest whole bit
			t.Errorf("-pow-time %v: first median %v", tc.powTime, first)
		}
		if tc.powTime <= 300*time.Millisecond && (first >= time.Second || last >= 5*time.Second) {
			t.Errorf("-pow-time %v: medians %v (first) and %v (last), want under 1 s and 5 s", tc.powTime, first, last)
		}
		if lifetime < 2*slowest || lifetime < signedwindow.DefaultChallengeLifetime {
			t.Errorf("-pow-time %v: lifetime %v, slowest solve %v", tc.powTime, lifetime, slowest)
		}
	}
}

func TestWindowWords(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Second: "this second", 30 * time.Second: "these 30 seconds", 90 * time.Second: "these 90 seconds",
		time.Minute: "this minute", 5 * time.Minute: "these 5 minutes", time.Hour: "this hour",
		2 * time.Hour: "these 2 hours", 24 * time.Hour: "today",
	} {
		if got := windowWords(d); got != want {
			t.Errorf("windowWords(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestShutdownWithAnUnusedConnection: a connection opened and never used
// (browsers open sockets ahead of time) does not make stopping the server
// fail; it is closed once the grace period is over. start's cleanup stops
// the server and checks run's result while the connection is still open.
func TestShutdownWithAnUnusedConnection(t *testing.T) {
	var conn net.Conn
	t.Cleanup(func() { // runs after start's cleanup
		if conn != nil {
			conn.Close()
		}
	})
	base := start(t)
	var err error
	if conn, err = net.Dial("tcp", strings.TrimPrefix(base, "http://")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the server accept it
}
