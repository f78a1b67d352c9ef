package main

import (
	_ "embed"
	"encoding/json"
	"html/template"
	"log/slog"
	"net/http"
	"net/mail"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/signedwindow"
)

// policyName is the name clients see in RateLimit-Policy.
const policyName = "contact-form"

// maxBody bounds the size of a posted form, in bytes.
const maxBody = 64 << 10

type config struct {
	pow            bool
	powBits        int
	limit          int64
	window         time.Duration
	trustedProxies int
	secureCookie   bool
	secret         []byte
	logger         *slog.Logger
}

type server struct {
	cfg     config
	limiter *signedwindow.Limiter
	guard   *ratekit.Guard // reads the token from requests as the middleware does
	key     ratekit.KeyFunc
}

//go:embed page.html
var pageHTML string

var (
	pageTmpl   = template.Must(template.New("page").Parse(pageHTML))
	thanksTmpl = template.Must(template.New("thanks").Parse(
		`<!doctype html><meta charset="utf-8"><title>Thanks</title><p>Thanks, {{.Name}}. You can send {{.Remaining}} more this window. <a href="/">Back</a></p>`))
	deniedTmpl = template.Must(template.New("denied").Parse(
		`<!doctype html><meta charset="utf-8"><title>Too many messages</title><p>You have sent {{.Limit}} messages this window. Try again in {{.Wait}}. <a href="/">Back</a></p>`))
)

// newServer builds the contact form's handler: GET / (the page), GET
// /challenge (a fresh proof-of-work challenge and the remaining count, as
// JSON) and POST /contact (limited).
func newServer(cfg config) (http.Handler, error) {
	limiter, err := signedwindow.New(signedwindow.Config{
		Name:   policyName,
		Limit:  cfg.limit,
		Window: cfg.window,
		Keys:   []signedwindow.Key{{ID: 1, Secret: cfg.secret}},
		// Catches a replayed token or a reused proof-of-work solution
		// inside this instance (about 80 bytes an entry).
		ReplayCacheSize: 10_000,
		// The work a post costs rises with the posts already made in the
		// window: each extra bit doubles it.
		Difficulty: &signedwindow.DifficultyPolicy{Base: cfg.powBits, Free: 2, Step: 2, Max: min(cfg.powBits+8, signedwindow.MaxDifficulty)},
	})
	if err != nil {
		return nil, err
	}
	key := ratekit.RemoteAddrKey()
	if cfg.trustedProxies > 0 {
		if key, err = ratekit.ForwardedForKey(cfg.trustedProxies); err != nil {
			return nil, err
		}
	}
	gcfg := ratekit.GuardConfig{
		Limiter: limiter,
		// signedwindow needs no store, so it fails only on bad input,
		// which is answered with 400 anyway. Letting a post through is the
		// right failure for a contact form.
		OnError:        ratekit.FailOpen,
		Logger:         cfg.logger,
		InsecureCookie: !cfg.secureCookie,
	}
	guard, err := ratekit.NewGuard(gcfg)
	if err != nil {
		return nil, err
	}
	s := &server{cfg: cfg, limiter: limiter, guard: guard, key: key}
	limit, err := ratekit.Middleware(ratekit.MiddlewareConfig{
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
	Remaining  int64  `json:"remaining"`
	Limit      int64  `json:"limit"`
	ResetAfter int64  `json:"reset_after"`
}

// current returns what the page and /challenge show: the remaining count
// and, with proof of work on, a challenge whose difficulty rises with the
// count already used.
func (s *server) current(r *http.Request) (challengeJSON, error) {
	key, d, err := s.status(r)
	if err != nil {
		return challengeJSON{}, err
	}
	out := challengeJSON{Remaining: d.Remaining, Limit: d.Limit, ResetAfter: int64(d.ResetAfter.Seconds() + 0.999)}
	if s.cfg.pow {
		c, err := s.limiter.NewChallenge(key, s.limiter.Difficulty(d.Limit-d.Remaining))
		if err != nil {
			return challengeJSON{}, err
		}
		out.Challenge, out.Difficulty = c.Value, c.Difficulty
	}
	return out, nil
}

func (s *server) page(w http.ResponseWriter, r *http.Request) {
	cur, err := s.current(r)
	if err != nil {
		http.Error(w, "cannot identify the client: "+err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	pageTmpl.Execute(w, struct {
		challengeJSON
		Window string
		Pow    bool
	}{cur, s.cfg.window.String(), s.cfg.pow})
}

func (s *server) challenge(w http.ResponseWriter, r *http.Request) {
	cur, err := s.current(r)
	if err != nil {
		problem(w, http.StatusBadRequest, "Bad Request", err.Error())
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, cur)
}

// requireWork refuses posts without a valid proof-of-work solution for this
// client at the difficulty its count demands now.
func (s *server) requireWork(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			problem(w, http.StatusBadRequest, "Bad Request", "unreadable form: "+err.Error())
			return
		}
		key, d, err := s.status(r)
		if err != nil {
			problem(w, http.StatusBadRequest, "Bad Request", err.Error())
			return
		}
		need := s.limiter.Difficulty(d.Limit - d.Remaining)
		if err := s.limiter.VerifySolution(r.PostForm.Get("pow"), key, need); err != nil {
			problem(w, http.StatusForbidden, "Proof of work required", err.Error())
			return
		}
		next.ServeHTTP(w, r)
	})
}

// contact accepts a message once the limiter has admitted the post.
func (s *server) contact(w http.ResponseWriter, r *http.Request) {
	d, _ := ratekit.DecisionFromContext(r.Context())
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
		}{name, d.Remaining})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "remaining": d.Remaining})
}

// denied answers a post over the limit: an HTML page for browsers posting the
// form without JavaScript, the problem+json body for everything else. The
// RateLimit fields and Retry-After are already set.
func (s *server) denied(w http.ResponseWriter, r *http.Request) {
	d, _ := ratekit.DecisionFromContext(r.Context())
	if wantsHTML(r) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusTooManyRequests)
		deniedTmpl.Execute(w, struct {
			Limit int64
			Wait  time.Duration
		}{d.Limit, d.RetryAfter.Round(time.Second)})
		return
	}
	w.Header().Set("Content-Type", ratekit.ProblemContentType)
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(ratekit.DeniedProblem(d))
}

func validate(name, email, message string) string {
	switch {
	case name == "" || utf8.RuneCountInString(name) > 200:
		return "name must be 1 to 200 characters"
	case len(email) > 254:
		return "email is too long"
	case message == "" || utf8.RuneCountInString(message) > 5000:
		return "message must be 1 to 5000 characters"
	}
	if a, err := mail.ParseAddress(email); err != nil || a.Address != email {
		return "email must be a plain address such as ada@example.com"
	}
	return ""
}

// wantsHTML reports whether the client is a browser posting the plain form
// (its Accept prefers HTML) rather than the page's script or an API client.
func wantsHTML(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/html")
}

func problem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", ratekit.ProblemContentType)
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(ratekit.Problem{Type: "about:blank", Title: title, Status: status, Detail: detail})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
