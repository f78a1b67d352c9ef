package main

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// styleRE finds a page's style sheet.
var styleRE = regexp.MustCompile(`(?s)<style>.*?</style>`)

// The server's own answers to a browser posting the plain form (the thanks,
// the 429 and the 403) are pages in the form's style, with a link back to
// the form, not one unstyled line.
func TestAnswerPagesLookLikeTheForm(t *testing.T) {
	form := styleRE.FindString(get(t, newClient(t), start(t, "-pow=false")+"/"))
	if form == "" {
		t.Fatal("the form has no style sheet")
	}
	check := func(what string, resp *http.Response, body string, status int, text string) {
		t.Helper()
		if resp.StatusCode != status || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
			t.Errorf("%s: %d %s, want %d and a page", what, resp.StatusCode, resp.Header.Get("Content-Type"), status)
		}
		if styleRE.FindString(body) != form {
			t.Errorf("%s: the page's style is not the form's:\n%s", what, body)
		}
		if !strings.Contains(body, `<a class="back" href="/">Back to the form</a>`) || !strings.Contains(body, text) {
			t.Errorf("%s: want %q and a link back to the form:\n%s", what, text, body)
		}
	}

	base := start(t, "-pow=false", "-limit", "1")
	c := newClient(t)
	resp, body := post(t, c, base, message(), "Accept", browserAccept)
	check("thanks", resp, body, http.StatusOK, "Thanks, Ada, your message was sent. You can send 0 more this minute.")
	resp, body = post(t, c, base, message(), "Accept", browserAccept)
	check("429", resp, body, http.StatusTooManyRequests,
		"you have sent 1 messages this minute. Please try again in "+resp.Header.Get("Retry-After")+" seconds.")

	resp, body = post(t, newClient(t), start(t, "-pow-bits", "8"), message(), "Accept", browserAccept)
	check("403", resp, body, http.StatusForbidden, "Please turn on JavaScript for this site")
}
