package main

import (
	_ "embed"
	"encoding/json"
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
	//go:embed page.html
	pageHTML string
	//go:embed pow.js
	powJS []byte
)

var (
	pageTmpl   = template.Must(template.New("page").Parse(pageHTML))
	thanksTmpl = template.Must(template.New("thanks").Parse(
		`<!doctype html><meta charset="utf-8"><title>Thanks</title><link rel="icon" href="data:,"><p>Thanks, {{.Name}}. You can send {{.Remaining}} more {{.Window}}. <a href="/">Back</a></p>`))
	deniedTmpl = template.Must(template.New("denied").Parse(
		`<!doctype html><meta charset="utf-8"><title>Too many messages</title><link rel="icon" href="data:,"><p>You have sent {{.Limit}} messages {{.Window}}. Please try again in {{.Seconds}} seconds. <a href="/">Back</a></p>`))
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
		// inside this instance (about 80 bytes an entry).
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
		Key:         key,
		Denied:      http.HandlerFunc(s.denied),
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

// status peeks at the client's window without counting anything.
func (s *server) status(r *http.Request) (key string, d ratekit.Decision, err error) {
	key, err = s.key(r)
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
	Limit      int64  `json:"limit"`
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
	out := challengeJSON{Remaining: d.Remaining, Limit: d.Limit, ResetAfter: int64(math.Ceil(d.ResetAfter.Seconds()))}
	if !d.Allowed {
		out.RetryAfter = retryAfter(d)
		return out, nil
	}
	if s.cfg.pow {
		c, err := s.limiter.NewChallenge(key, s.limiter.Difficulty(d.Limit-d.Remaining))
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
		problem(w, http.StatusBadRequest, "Bad Request", "This connection cannot be identified, so the form cannot be used from it.")
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
			problem(w, http.StatusBadRequest, "Bad Request", "The form could not be read. Please reload the page and try again.")
			return
		}
		key, d, err := s.status(r)
		if err != nil {
			s.cfg.logger.Warn("contact form post", "err", err)
			problem(w, http.StatusBadRequest, "Bad Request", "This connection cannot be identified, so the form cannot be used from it.")
			return
		}
		if !d.Allowed {
			httplimit.SetHeaders(w.Header(), d, false)
			s.deny(w, r, d)
			return
		}
		need := s.limiter.Difficulty(d.Limit - d.Remaining)
		if err := s.limiter.VerifySolution(r.PostForm.Get("pow"), key, need); err != nil {
			// The page fetches a new challenge and tries again on 403; the
			// reason is for the log, not for people.
			s.cfg.logger.Info("contact form proof of work refused", "err", err)
			problem(w, http.StatusForbidden, "Proof of work required",
				"The form's anti-spam check was missing or out of date. Please reload the page and send again.")
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
		problem(w, http.StatusBadRequest, "Bad Request", msg)
		return
	}
	// A real form would send the message on; this one logs it.
	s.cfg.logger.Info("contact message", "name", name, "email", email, "chars", utf8.RuneCountInString(message),
		"remaining", d.Remaining)
	if wantsHTML(r) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		thanksTmpl.Execute(w, struct {
			Name      string
			Remaining int64
			Window    string
		}{name, d.Remaining, windowWords(s.cfg.window)})
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
	if wantsHTML(r) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusTooManyRequests)
		deniedTmpl.Execute(w, struct {
			Limit   int64
			Window  string
			Seconds string
		}{d.Limit, windowWords(s.cfg.window), w.Header().Get(httplimit.HeaderRetryAfter)})
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

// wantsHTML reports whether the client is a browser posting the plain form
// (its Accept prefers HTML) rather than the page's script or an API client.
func wantsHTML(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/html")
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
