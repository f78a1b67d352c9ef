package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratekit/ratekit/httplimit"
)

// browserAccept is the Accept field Chromium sends with a form post.
const browserAccept = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7"

// TestCommandLine runs the built program as a person would: -h prints the
// usage and succeeds, an unknown flag is reported once, and flag values
// the form cannot work with are refused with an error that names the flag.
func TestCommandLine(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "contactform")
	if out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string // in the output
		once string // exactly once in the output
	}{
		{[]string{"-h"}, 0, "Usage: contactform [flags]", "-trusted-proxies"},
		{[]string{"-help"}, 0, "RATEKIT_SECRET", "Usage: contactform"},
		{[]string{"-nope"}, 2, "Usage: contactform", "flag provided but not defined: -nope"},
		{[]string{"-limit", "x"}, 2, "Usage: contactform", `invalid value "x" for flag -limit`},
		{[]string{"-trusted-proxies", "-1"}, 1, "", "contactform: -trusted-proxies is -1; it must be 0 (key clients by the connection address) or more\n"},
		{[]string{"-limit", "0"}, 1, "", "contactform: -limit is 0; it must be at least 1\n"},
		{[]string{"-window", "1500ms"}, 1, "", "contactform: -window is 1.5s; it must be whole seconds"},
		{[]string{"-pow-bits", "40"}, 1, "", "contactform: -pow-bits is 40; it must be 0 (use -pow-time) to 32\n"},
		{[]string{"serve"}, 1, "", `contactform: unexpected argument "serve"`},
	} {
		cmd := exec.Command(exe, tc.args...)
		cmd.Env = []string{"PORT=0", "RATEKIT_SECRET=0123456789abcdef0123456789abcdef-test"}
		out, err := cmd.CombinedOutput()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if code != tc.code || !strings.Contains(string(out), tc.want) || strings.Count(string(out), tc.once) != 1 {
			t.Errorf("contactform %s: exit %d, want %d, %q once and %q; output:\n%s",
				strings.Join(tc.args, " "), code, tc.code, tc.once, tc.want, out)
		}
	}
}

// A short RATEKIT_SECRET is refused with an error that names it.
func TestShortSecret(t *testing.T) {
	env := map[string]string{"PORT": "0", "RATEKIT_SECRET": "0123456789"}
	var logs syncBuffer
	err := run(context.Background(), []string{"-host", "127.0.0.1"}, func(k string) string { return env[k] }, &logs, nil)
	if err == nil || err.Error() != "RATEKIT_SECRET is 10 bytes; need at least 32 (for example the output of: openssl rand -base64 32)" {
		t.Fatalf("run with a 10-byte secret: %v", err)
	}
}

// A post without proof of work is refused with 403: a page in words for a
// person to a browser posting the plain form (which it does without
// JavaScript), problem+json to the page's script and API clients. The log
// says why once, in plain words.
func TestWorkRequiredAnswers(t *testing.T) {
	base, logs := startWithLogs(t, "-pow-bits", "8")
	c := newClient(t)
	for _, accept := range []string{"text/html", browserAccept, "text/html;q=0.9, application/json;q=0.5"} {
		resp, body := post(t, c, base, message(), "Accept", accept)
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" ||
			!strings.Contains(body, "Your message was not sent.") || !strings.Contains(body, "Please turn on JavaScript for this site") ||
			strings.Contains(body, `"title"`) {
			t.Errorf("Accept %s: %d %s\n%s", accept, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
	for _, accept := range []string{"application/json", "*/*", "", "application/json, text/html;q=0.5", "text/html;q=0"} {
		resp, body := post(t, c, base, message(), "Accept", accept)
		var p httplimit.Problem
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Content-Type") != httplimit.ProblemContentType ||
			json.Unmarshal([]byte(body), &p) != nil || p.Title != "Proof of work required" || p.Status != 403 {
			t.Errorf("Accept %q: %d %s\n%s", accept, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
	log := logs.String()
	if !strings.Contains(log, `msg="contact form post refused: proof of work" reason="no solution sent"`) || strings.Contains(log, "signedwindow:") {
		t.Errorf("log:\n%s", log)
	}
}

// A post whose client cannot be told (fewer X-Forwarded-For entries than
// -trusted-proxies) gets a 400 in client words; the developer's reason is
// in the log only. With the proof of work off, the limiter's middleware
// would otherwise answer it with the key function's error.
func TestNoClientAddress(t *testing.T) {
	for _, args := range [][]string{{"-pow=false", "-trusted-proxies", "1"}, {"-pow-bits", "8", "-trusted-proxies", "2"}} {
		base, logs := startWithLogs(t, args...)
		c := newClient(t)
		resp, body := post(t, c, base, message(), "Accept", "application/json")
		var p httplimit.Problem
		if resp.StatusCode != 400 || json.Unmarshal([]byte(body), &p) != nil ||
			p.Detail != "The server could not tell where your connection comes from, so it cannot accept messages from it. Please try again later." {
			t.Errorf("%v: %d %s", args, resp.StatusCode, body)
		}
		resp, body = post(t, c, base, message(), "Accept", browserAccept)
		if resp.StatusCode != 400 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
			!strings.Contains(body, "could not tell where your connection comes from") {
			t.Errorf("%v, from a browser: %d %s", args, resp.StatusCode, body)
		}
		if strings.Contains(body, "X-Forwarded-For") || !strings.Contains(logs.String(), "X-Forwarded-For has fewer than") {
			t.Errorf("%v: body %s\nlog:\n%s", args, body, logs.String())
		}
	}
}

// Without JavaScript (and without proof of work) the plain form is told in
// a page what is wrong with a post, not in JSON.
func TestInvalidPostFromABrowser(t *testing.T) {
	base := start(t, "-pow=false")
	bad := message()
	bad.Set("email", "not an address")
	resp, body := post(t, newClient(t), base, bad, "Accept", browserAccept)
	if resp.StatusCode != 400 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(body, "Your message was not sent. Please enter a plain email address, such as ada@example.com.") {
		t.Fatalf("%d %s\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}

func TestPrefersHTML(t *testing.T) {
	for accept, want := range map[string]bool{
		"":                                     false,
		"*/*":                                  false,
		"application/json":                     false,
		"text/html":                            true,
		browserAccept:                          true,
		"text/*":                               true,
		"text/html;q=0.4, application/*;q=0.5": false,
		"text/html;q=0.6, application/*;q=0.5": true,
		"TEXT/HTML; Q=0.6, */*;q=0.1":          true,
		"text/html;q=x":                        false,
		"application/problem+json, text/html;q=0.9": false,
	} {
		r, _ := http.NewRequest("POST", "/contact", nil)
		if accept != "" {
			r.Header.Set("Accept", accept)
		}
		if got := prefersHTML(r); got != want {
			t.Errorf("prefersHTML(Accept: %s) = %v, want %v", accept, got, want)
		}
	}
}
