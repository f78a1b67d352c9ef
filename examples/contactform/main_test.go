package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/signedwindow"
)

// start runs the contact form on a free loopback port and returns its base
// URL; the server is shut down (and run's result checked) when the test ends.
func start(t *testing.T, args ...string) string {
	t.Helper()
	env := map[string]string{"PORT": "0", "RATEKIT_SECRET": "0123456789abcdef0123456789abcdef-test"}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-host", "127.0.0.1"}, args...), func(k string) string { return env[k] }, io.Discard, ready)
	}()
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
	return "http://" + addr
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
	if ct := resp.Header.Get("Content-Type"); ct != ratekit.ProblemContentType || !strings.Contains(body, "quota-exceeded") {
		t.Fatalf("429 body %s (%s)", body, ct)
	}

	// A browser posting the plain form gets a page, with the same headers.
	resp, body = post(t, c, base, message(), "Accept", "text/html")
	if resp.StatusCode != 429 || !strings.Contains(body, "Try again in") || resp.Header.Get("Retry-After") == "" {
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
			if resp, body := post(t, c, base, form, client...); resp.StatusCode != 403 || !strings.Contains(body, "already used") {
				t.Fatalf("reused solution: %d %s", resp.StatusCode, body)
			}
		}
	}
	if !(difficulties[0] < difficulties[3]) {
		t.Fatalf("difficulty did not rise with the count: %v", difficulties)
	}

	// A solution for another client does not work for this one.
	ch, _ := challenge()
	solution, _ := signedwindow.Solve(context.Background(), ch)
	form := message()
	form.Set("pow", solution)
	if resp, body := post(t, newClient(t), base, form, "X-Forwarded-For", "203.0.113.99"); resp.StatusCode != 403 {
		t.Fatalf("other client's solution: %d %s", resp.StatusCode, body)
	}

	// The 5th post of this client, with valid work, is over the limit.
	if resp, body := post(t, c, base, form, client...); resp.StatusCode != 429 {
		t.Fatalf("5th post: %d %s, want 429", resp.StatusCode, body)
	}
}
