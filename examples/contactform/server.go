package main

import (
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"math"
	"net/http"
	"net/mail"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/signedwindow"
)

// policyName is the name clients see in RateLimit-Policy.
const policyName = "contact-form"

// maxBody bounds the size of a posted form, in bytes.
const maxBody = 64 << 10

// browserHashRate is the proof-of-work rate, in SHA-256 computations per
// second, that difficulties are calibrated to: a conservative rate for
// pow.js in one Web Worker, below what it reaches in headless Chromium on a
// busy shared server core (TestBrowserHashRate logs the rate of the Chromium
// it drives). A device k times slower takes k times the times below.
const browserHashRate = 500_000

// Expected work per post, for the default policy: the first Free posts of a
// window cost the base difficulty, and each later one doubles it, up to
// maxExtraBits more (8 times the work at most).
const (
	freePosts    = 2
	maxExtraBits = 3
)

type config struct {
	pow            bool
	powTime        time.Duration // median solve time of a first post; used when powBits is 0
	powBits        int           // base difficulty in bits; 0 derives it from powTime
	limit          int64
	window         time.Duration
	trustedProxies int
	secureCookie   bool
	secret         []byte
	logger         *slog.Logger
}

// difficulty returns the proof-of-work policy for cfg and a challenge
// lifetime that covers the slowest solve it can ask for.
//
// A solve at b bits takes a geometric number of tries with mean 2^b; its
// median is ln 2 * 2^b tries and it exceeds k * 2^b tries with probability
// e^-k. The base difficulty is the one whose median at browserHashRate is
// closest to powTime. The lifetime covers the 99.99th percentile (k = 9.2) of
// the hardest difficulty on a device four times slower than browserHashRate,
// twice over, and is at least signedwindow's default.
func (cfg config) difficulty() (signedwindow.DifficultyPolicy, time.Duration) {
	base := cfg.powBits
	if base == 0 {
		tries := cfg.powTime.Seconds() * browserHashRate / math.Ln2
		base = max(int(math.Round(math.Log2(max(tries, 1)))), 1)
	}
	base = min(base, signedwindow.MaxDifficulty)
	p := signedwindow.DifficultyPolicy{Base: base, Free: freePosts, Step: 1, Max: min(base+maxExtraBits, signedwindow.MaxDifficulty)}
	slowest := 9.2 * math.Exp2(float64(p.Max)) / (browserHashRate / 4)
	lifetime := max(2*time.Duration(slowest*float64(time.Second)), signedwindow.DefaultChallengeLifetime)
	return p, (lifetime + time.Second - 1).Truncate(time.Second)
}

// windowWords names a window for people: "this minute", "this hour",
// "these 30 seconds".
func windowWords(d time.Duration) string {
	switch {
	case d == time.Second:
		return "this second"
	case d == time.Minute:
		return "this minute"
	case d == time.Hour:
		return "this hour"
	case d == 24*time.Hour:
		return "today"
	case d%time.Hour == 0:
		return fmt.Sprintf("these %d hours", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("these %d minutes", d/time.Minute)
	}
	return fmt.Sprintf("these %d seconds", d/time.Second)
}

type server struct {
	cfg     config
	limiter *signedwindow.Limiter
	guard   *httplimit.Guard // reads the token from requests as the middleware does
	key     httplimit.KeyFunc
}

var (
	//go:embed page.html answer.html style.html
	pages embed.FS
	//go:embed pow.js
	powJS []byte
)

var (
	templates = template.Must(template.ParseFS(pages, "*.html"))
	// pageTmpl is the form; answerTmpl is the server's answer to a post of
	// the plain form (a browser without JavaScript): a page in the form's
	// style with a link back to it.
	pageTmpl   = templates.Lookup("page.html")
	answerTmpl = templates.Lookup("answer.html")
)

// answer is what answerTmpl shows: a title, a sentence, and whether it is
// good news (green) or not (red).
type answer struct {
	Title, Text string
	OK          bool
}

// refusal is a post the form refuses, told in words for the person who sent
// it: Detail in the problem+json answer (for the page's script, which shows
// a 400's detail, and for API clients), Page in the HTML answer to a browser
// that posted the plain form. Why it was refused, in a developer's terms,
// goes to the log, never here.
type refusal struct {
	Status int
	Title  string // the problem's title
	Detail string
	Page   string // the HTML page's text; empty means Detail
}

var (
	unreadableForm = refusal{Status: http.StatusBadRequest, Title: "Bad Request",
		Detail: "The form could not be read. Please reload the page and try again."}
	unknownClient = refusal{Status: http.StatusBadRequest, Title: "Bad Request",
		Detail: "The server could not tell where your connection comes from, so it cannot accept messages from it. Please try again later."}
	// The page's script meets a 403 only when its solution went stale,
	// and solves a new challenge without a word; a person sees the page
	// only after posting the plain form, which happens without JavaScript.
	workRequired = refusal{Status: http.StatusForbidden, Title: "Proof of work required",
		Detail: "The form's anti-spam check was missing or out of date. Please reload the page and send again.",
		Page: "Your message was not sent. Before it sends, this form has your browser do a short calculation that keeps spam robots out, " +
			"and that needs JavaScript. Please turn on JavaScript for this site, then reload the form and send your message again."}
)

// newServer builds the contact form's handler: GET / (the page), GET /pow.js
// (the page's proof-of-work worker), GET /challenge (a fresh proof-of-work
// challenge and the remaining count, as JSON) and POST /contact (limited).
func newServer(cfg config) (http.Handler, error) {
	policy, lifetime := cfg.difficulty()
	if !cfg.pow {
		policy = signedwindow.DifficultyPolicy{}
	}
	limiter, err := signedwindow.New(signedwindow.Config{
		Name:   policyName,
		Quota:  cfg.limit,
		Window: cfg.window,
		Keys:   []signedwindow.Key{{ID: 1, Secret: cfg.secret}},
		// Catches a replayed token or a reused proof-of-work solution
		// inside this instance (under 1 MB when full; the size of an
		// entry is in signedwindow.Config.ReplayCacheSize's doc).
		ReplayCacheSize:   10_000,
		ChallengeLifetime: lifetime,
		Difficulty:        &policy,
	})
	if err != nil {
		return nil, err
	}
	key := httplimit.RemoteAddrKey()
	if cfg.trustedProxies > 0 {
		if key, err = httplimit.ForwardedForKey(cfg.trustedProxies); err != nil {
			return nil, err
		}
	}
	gcfg := httplimit.GuardConfig{
		Limiter: limiter,
		// signedwindow keeps no store, so Allow fails only on a request it
		// cannot decide: an invalid key (the Guard answers 400 whatever
		// OnError says), a request whose context ended (its client is
		// gone), or a clock reading outside 1970 to year 36812. For the
		// last, letting a post through is the right failure for a contact
		// form.
		OnError:        httplimit.FailOpen,
		Logger:         cfg.logger,
		InsecureCookie: !cfg.secureCookie,
	}
	guard, err := httplimit.NewGuard(gcfg)
	if err != nil {
		return nil, err
	}
	s := &server{cfg: cfg, limiter: limiter, guard: guard, key: key}
	limit, err := httplimit.Middleware(httplimit.MiddlewareConfig{
		GuardConfig: gcfg,
		// s.keyed has derived the key already and refused a post without
		// one in words for people.
		Key:    keyFromContext,
		Denied: http.HandlerFunc(s.denied),
	})
	if err != nil {
		return nil, err
	}

	contact := limit(http.HandlerFunc(s.contact))
	if cfg.pow {
		// The work is checked before the limiter counts, so a flood without
		// solutions costs the server one hash each and counts nothing.
		contact = s.requireWork(contact)
	}
	contact = s.keyed(contact)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.page)
	mux.HandleFunc("GET /pow.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		w.Write(powJS)
	})
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent) // no icon, and no 404 in the browser's console
	})
	mux.HandleFunc("GET /challenge", s.challenge)
	mux.Handle("POST /contact", http.MaxBytesHandler(contact, maxBody))
	return mux, nil
}

type keyContext struct{}

// keyed derives the client's key before anything else reads a post. A post
// without a usable key (no address, or fewer X-Forwarded-For entries than
// -trusted-proxies says) is refused in words for people, and why goes to
// the log: the limiter's middleware would answer it with the key function's
// error as the problem's detail, which is meant for developers. The
// middleware reads the key from the context instead (keyFromContext).
func (s *server) keyed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := s.key(r)
		if err != nil {
			s.cfg.logger.Warn("contact form post refused: no client address", "err", err, "trusted_proxies", s.cfg.trustedProxies)
			s.refuse(w, r, unknownClient)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), keyContext{}, key)))
	})
}

// keyFromContext is the middleware's key function: the key keyed derived.
func keyFromContext(r *http.Request) (string, error) {
	if key, ok := r.Context().Value(keyContext{}).(string); ok {
		return key, nil
	}
	return "", httplimit.ErrNoKey
}

// status peeks at the client's window without counting anything.
func (s *server) status(r *http.Request) (key string, d ratekit.Decision, err error) {
	key, err = keyFromContext(r)
	if err != nil {
		key, err = s.key(r)
	}
	if err != nil {
		return "", d, err
	}
	d, err = s.limiter.Peek(r.Context(), ratekit.Request{Key: key, Cost: 1, State: s.guard.State(r.Header)})
	return key, d, err
}

type challengeJSON struct {
	Challenge  string `json:"challenge,omitempty"`
	Difficulty int    `json:"difficulty"`
	ExpiresIn  int64  `json:"expires_in_ms,omitempty"` // challenge lifetime left, in milliseconds
	Remaining  int64  `json:"remaining"`
	Quota      int64  `json:"quota"`
	ResetAfter int64  `json:"reset_after"`           // seconds until the window ends
	RetryAfter int64  `json:"retry_after,omitempty"` // seconds until a post may succeed, when Remaining is 0
}

// retryAfter returns the Retry-After seconds ratekit sends for a denial d,
// so that the page, the JSON and the header always say the same.
func retryAfter(d ratekit.Decision) int64 {
	h := http.Header{}
	httplimit.SetHeaders(h, d, false)
	n, _ := strconv.ParseInt(h.Get(httplimit.HeaderRetryAfter), 10, 64)
	return n
}

// current returns what the page and /challenge show: the remaining count
// and, with proof of work on and quota left, a challenge whose difficulty
// rises with the count already used. A client with nothing left gets no
// challenge, only the time to wait: it is not asked to work for a post that
// would be refused.
func (s *server) current(r *http.Request) (challengeJSON, error) {
	key, d, err := s.status(r)
	if err != nil {
		return challengeJSON{}, err
	}
	out := challengeJSON{Remaining: d.Remaining, Quota: d.Quota, ResetAfter: int64(math.Ceil(d.ResetAfter.Seconds()))}
	if !d.Allowed {
		out.RetryAfter = retryAfter(d)
		return out, nil
	}
	if s.cfg.pow {
		c, err := s.limiter.NewChallenge(key, s.limiter.Difficulty(d.Quota-d.Remaining))
		if err != nil {
			return challengeJSON{}, err
		}
		out.Challenge, out.Difficulty = c.Value, c.Difficulty
		out.ExpiresIn = time.Until(c.Expires).Milliseconds()
	}
	return out, nil
}

func (s *server) page(w http.ResponseWriter, r *http.Request) {
	cur, err := s.current(r)
	if err != nil {
		s.cfg.logger.Warn("contact form page", "err", err)
		http.Error(w, "Sorry, this page cannot be shown to your connection right now. Please try again later.", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	pageTmpl.Execute(w, struct {
		challengeJSON
		Window string
		Pow    bool
	}{cur, windowWords(s.cfg.window), s.cfg.pow})
}

func (s *server) challenge(w http.ResponseWriter, r *http.Request) {
	cur, err := s.current(r)
	if err != nil {
		s.cfg.logger.Warn("contact form challenge", "err", err)
		problem(w, unknownClient.Status, unknownClient.Title, unknownClient.Detail)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, cur)
}

// requireWork refuses posts without a valid proof-of-work solution for this
// client at the difficulty its count demands now. A client whose quota is
// spent gets 429 at once, with or without work: there is nothing to solve
// for.
func (s *server) requireWork(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			s.cfg.logger.Info("contact form post refused: unreadable form", "err", err)
			s.refuse(w, r, unreadableForm)
			return
		}
		key, d, err := s.status(r)
		if err != nil {
			s.cfg.logger.Warn("contact form post", "err", err)
			s.refuse(w, r, unknownClient)
			return
		}
		if !d.Allowed {
			httplimit.SetHeaders(w.Header(), d, false)
			s.deny(w, r, d)
			return
		}
		need := s.limiter.Difficulty(d.Quota - d.Remaining)
		if err := s.limiter.VerifySolution(r.PostForm.Get("pow"), key, need); err != nil {
			// The page fetches a new challenge and tries again on 403; the
			// reason is for the log, not for people.
			s.cfg.logger.Info("contact form post refused: proof of work", "reason", workRefusal(err))
			s.refuse(w, r, workRequired)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// contact accepts a message once the limiter has admitted the post.
func (s *server) contact(w http.ResponseWriter, r *http.Request) {
	d, _ := httplimit.DecisionFromContext(r.Context())
	name := strings.TrimSpace(r.PostFormValue("name"))
	email := strings.TrimSpace(r.PostFormValue("email"))
	message := strings.TrimSpace(r.PostFormValue("message"))
	if msg := validate(name, email, message); msg != "" {
		s.refuse(w, r, refusal{Status: http.StatusBadRequest, Title: "Bad Request", Detail: msg,
			Page: "Your message was not sent. " + msg})
		return
	}
	// A real form would send the message on; this one logs it.
	s.cfg.logger.Info("contact message", "name", name, "email", email, "chars", utf8.RuneCountInString(message),
		"remaining", d.Remaining)
	if prefersHTML(r) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		answerTmpl.Execute(w, answer{Title: "Message sent", OK: true,
			Text: fmt.Sprintf("Thanks, %s, your message was sent. You can send %d more %s.", name, d.Remaining, windowWords(s.cfg.window))})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "remaining": d.Remaining})
}

// denied answers a post over the limit (the Middleware's Denied handler).
func (s *server) denied(w http.ResponseWriter, r *http.Request) {
	d, _ := httplimit.DecisionFromContext(r.Context())
	s.deny(w, r, d)
}

// deny answers a post over the limit with 429: an HTML page for browsers
// posting the form without JavaScript, the problem+json body for everything
// else. The RateLimit fields and Retry-After must already be set; the page
// quotes the same seconds as Retry-After.
func (s *server) deny(w http.ResponseWriter, r *http.Request, d ratekit.Decision) {
	if prefersHTML(r) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusTooManyRequests)
		answerTmpl.Execute(w, answer{Title: "Too many messages",
			Text: fmt.Sprintf("Your message was not sent: you have sent %d messages %s. Please try again in %s seconds.",
				d.Quota, windowWords(s.cfg.window), w.Header().Get(httplimit.HeaderRetryAfter))})
		return
	}
	w.Header().Set("Content-Type", httplimit.ProblemContentType)
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(httplimit.DeniedProblem(d))
}

func validate(name, email, message string) string {
	switch {
	case name == "" || utf8.RuneCountInString(name) > 200:
		return "Please enter your name (up to 200 characters)."
	case len(email) > 254:
		return "That email address is too long."
	case message == "" || utf8.RuneCountInString(message) > 5000:
		return "Please write a message (up to 5000 characters)."
	}
	if a, err := mail.ParseAddress(email); err != nil || a.Address != email {
		return "Please enter a plain email address, such as ada@example.com."
	}
	return ""
}

// refuse answers a post the form does not accept: an HTML page for a
// browser posting the plain form, the problem+json body for everything else.
func (s *server) refuse(w http.ResponseWriter, r *http.Request, rf refusal) {
	if prefersHTML(r) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(rf.Status)
		answerTmpl.Execute(w, answer{Title: "Message not sent", Text: cmp.Or(rf.Page, rf.Detail)})
		return
	}
	problem(w, rf.Status, rf.Title, rf.Detail)
}

// workRefusal says in plain words why VerifySolution refused a solution,
// for the log. (signedwindow's error text names its package at each layer
// and calls every signed value a token.)
func workRefusal(err error) string {
	switch {
	case errors.Is(err, signedwindow.ErrTokenMissing):
		return "no solution sent"
	case errors.Is(err, signedwindow.ErrTokenMalformed):
		return "malformed solution"
	case errors.Is(err, signedwindow.ErrTokenUnknownKey):
		return "challenge signed by an unknown key"
	case errors.Is(err, signedwindow.ErrTokenInvalid):
		return "challenge forged, edited or issued to another client"
	case errors.Is(err, signedwindow.ErrTokenExpired):
		return "challenge expired"
	case errors.Is(err, signedwindow.ErrTokenFuture):
		return "challenge dated in the future (is this instance's clock behind?)"
	case errors.Is(err, signedwindow.ErrTokenReplayed):
		return "solution already used"
	case errors.Is(err, signedwindow.ErrDifficultyTooLow):
		return "challenge easier than the client's count now asks for"
	case errors.Is(err, signedwindow.ErrWorkInsufficient):
		return "solution does not do the challenge's work"
	case errors.Is(err, ratekit.ErrInvalidRequest):
		return "invalid client key"
	}
	return err.Error()
}

// prefersHTML reports whether the client prefers an HTML page to JSON, as a
// browser posting the plain form does (its Accept starts with text/html);
// the page's script asks for application/json, and an API client that
// sends */* or no Accept at all gets JSON too.
func prefersHTML(r *http.Request) bool {
	accept := r.Header.Values("Accept")
	html := acceptQuality(accept, "text", "html")
	json := max(acceptQuality(accept, "application", "json"), acceptQuality(accept, "application", "problem+json"))
	return html > json
}

// acceptQuality returns the weight (q) that the Accept field lines give to
// the media type typ/sub: that of the most specific media range matching it
// (typ/sub, then typ/*, then */*), 0 when none does (RFC 9110, section
// 12.5.1). Parameters other than q are ignored.
func acceptQuality(lines []string, typ, sub string) float64 {
	best, q := 0, 0.0
	for _, line := range lines {
		for elem := range strings.SplitSeq(line, ",") {
			mediaRange, params, _ := strings.Cut(elem, ";")
			t, st, ok := strings.Cut(strings.ToLower(strings.TrimSpace(mediaRange)), "/")
			if !ok {
				continue
			}
			specificity := 0
			switch {
			case t == typ && st == sub:
				specificity = 3
			case t == typ && st == "*":
				specificity = 2
			case t == "*" && st == "*":
				specificity = 1
			}
			if specificity <= best {
				continue
			}
			weight := 1.0
			for p := range strings.SplitSeq(params, ";") {
				k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
				if strings.EqualFold(k, "q") {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil || f < 0 || f > 1 {
						weight = -1
					} else {
						weight = f
					}
				}
			}
			if weight < 0 {
				continue // a malformed weight: ignore the range
			}
			best, q = specificity, weight
		}
	}
	return q
}

func problem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", httplimit.ProblemContentType)
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(httplimit.Problem{Type: "about:blank", Title: title, Status: status, Detail: detail})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
