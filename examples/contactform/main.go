// Command contactform serves a contact form protected by ratekit's
// signedwindow strategy: a few posts a minute per client, with no storage at
// all, and a proof-of-work challenge that the page solves in the browser
// before it posts.
//
// Run it from the repository root with (the examples are a module of their
// own):
//
//	go -C examples run ./contactform            # http://localhost:8080
//	go -C examples run ./contactform -pow=false # limit visible with curl
//
// The page hands the proof of work to a Web Worker (pow.js, a synchronous
// SHA-256 in JavaScript, which also works where crypto.subtle is missing:
// a page served over plain HTTP from a non-loopback address), so it answers
// input while it works, and solves while the visitor types. The difficulty
// is set as a median solve time (-pow-time, 300 ms by default for a window's
// first two posts, doubling for each later post up to 8 times) at the hash
// rate browserHashRate, measured in headless Chromium; challenges live long
// enough for the slowest solve the policy can ask for. A client whose quota
// is spent gets no challenge and an immediate 429 with Retry-After, and the
// page counts down until it may send again. Without JavaScript the proof of
// work cannot run: the page says the form needs JavaScript and keeps Send
// disabled, and a plain form post without a solution is answered 403 with a
// page that says the same (JSON problem details to clients that prefer
// JSON). With -pow=false the form works without JavaScript.
//
// It listens on $PORT (default 8080) on all interfaces, so it runs unchanged
// as a Cloud Run service. The HMAC secret comes from $RATEKIT_SECRET (at least
// 32 bytes; every instance must share it); without it a random secret is made
// at start, which is fine for one local process but makes tokens worthless
// across instances and restarts.
//
// What the limit does and does not stop: it counts per client IP in a token
// the client carries, so it stops accidental floods, runaway scripts and
// casual abuse that keeps its cookie. A client that drops its cookie is still
// counted by the instance that saw it (the limiter's replay cache remembers
// each address's window), but starts a fresh count on any other instance;
// the proof of work is what makes that expensive.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"github.com/ratekit/ratekit/examples/internal/serve"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ratekit/ratekit/signedwindow"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil)
	var usage usageError
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		// -h or -help: the usage is printed, and asking for it is no failure.
	case errors.As(err, &usage):
		// The flag package has printed the error and the usage already.
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "contactform:", err)
		os.Exit(1)
	}
}

// usageError is a command-line error that the flag package has already
// printed, with the usage, so main only exits.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usage prints what the flags are and which environment variables the
// program reads.
func usage(fs *flag.FlagSet) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, `Usage: contactform [flags]

Serves a contact form limited per client by ratekit's signedwindow strategy,
with a proof of work that the page solves in the browser (JavaScript).

Environment:
  PORT            port to listen on (default 8080)
  RATEKIT_SECRET  HMAC secret, at least %d bytes, shared by every instance
                  (default: a random secret, good for one process only)
  K_SERVICE       set on Cloud Run: JSON logs and a Secure cookie

Flags:
`, signedwindow.MinSecretLen)
		fs.PrintDefaults()
	}
}

// check refuses flag values the form cannot work with, naming the flag, and
// arguments that are not flags.
func (cfg config) check(rest []string) error {
	switch {
	case len(rest) > 0:
		return fmt.Errorf("unexpected argument %q: contactform takes flags only (see -h)", rest[0])
	case cfg.limit < 1:
		return fmt.Errorf("-limit is %d; it must be at least 1", cfg.limit)
	case cfg.window < time.Second || cfg.window > signedwindow.MaxWindow || cfg.window%time.Second != 0:
		return fmt.Errorf("-window is %v; it must be whole seconds from 1s to %v", cfg.window, signedwindow.MaxWindow)
	case cfg.trustedProxies < 0:
		return fmt.Errorf("-trusted-proxies is %d; it must be 0 (key clients by the connection address) or more", cfg.trustedProxies)
	case cfg.powTime <= 0:
		return fmt.Errorf("-pow-time is %v; it must be positive", cfg.powTime)
	case cfg.powBits < 0 || cfg.powBits > signedwindow.MaxDifficulty:
		return fmt.Errorf("-pow-bits is %d; it must be 0 (use -pow-time) to %d", cfg.powBits, signedwindow.MaxDifficulty)
	}
	return nil
}

// run parses args, serves until ctx ends and returns nil after a clean
// shutdown. When ready is not nil it receives the address the server
// listens on. For -h it prints the usage to stderr and returns
// flag.ErrHelp; for a flag the flag package refuses it prints the error and
// the usage and returns a usageError.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("contactform", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	fs.BoolVar(&cfg.pow, "pow", true, "require a proof-of-work solution with every post")
	fs.Int64Var(&cfg.limit, "limit", 5, "posts per window and client")
	fs.DurationVar(&cfg.window, "window", time.Minute, "window length (whole seconds)")
	fs.IntVar(&cfg.trustedProxies, "trusted-proxies", 0,
		"number of proxies in front of the server that append to X-Forwarded-For (1 on Cloud Run); 0 keys by the connection address")
	fs.DurationVar(&cfg.powTime, "pow-time", 300*time.Millisecond,
		"median time a browser needs for the proof of work of a window's first two posts; each further post doubles it, up to 8 times")
	fs.IntVar(&cfg.powBits, "pow-bits", 0,
		"proof-of-work difficulty in leading zero bits for a window's first two posts, instead of -pow-time; each further post adds 1, up to 3 more")
	host := fs.String("host", "", "interface to listen on (empty: all)")
	secure := fs.Bool("secure-cookie", getenv("K_SERVICE") != "",
		"mark the token cookie Secure (default true on Cloud Run, where K_SERVICE is set)")
	fs.Usage = usage(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if err := cfg.check(fs.Args()); err != nil {
		return err
	}
	cfg.secureCookie = *secure

	var logger *slog.Logger
	if getenv("K_SERVICE") != "" {
		logger = slog.New(slog.NewJSONHandler(stderr, nil)) // Cloud Logging reads JSON lines
	} else {
		logger = slog.New(slog.NewTextHandler(stderr, nil))
	}
	cfg.logger = logger

	cfg.secret = []byte(getenv("RATEKIT_SECRET"))
	switch {
	case len(cfg.secret) == 0:
		cfg.secret = make([]byte, signedwindow.MinSecretLen)
		rand.Read(cfg.secret)
		logger.Warn("RATEKIT_SECRET is not set: using a random secret; tokens will not survive a restart or work across instances")
	case len(cfg.secret) < signedwindow.MinSecretLen:
		return fmt.Errorf("RATEKIT_SECRET is %d bytes; need at least %d (for example the output of: openssl rand -base64 32)",
			len(cfg.secret), signedwindow.MinSecretLen)
	}

	handler, err := newServer(cfg)
	if err != nil {
		return err
	}

	port := getenv("PORT")
	if port == "" {
		port = "8080"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(*host, port))
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("contact form listening", "addr", "http://"+ln.Addr().String(),
		"limit", cfg.limit, "window", cfg.window, "pow", cfg.pow)
	if cfg.pow {
		p, lifetime := cfg.difficulty()
		logger.Info("proof of work", "bits", fmt.Sprintf("%d to %d", p.Base, p.Max), "challenge_lifetime", lifetime)
	}
	if ready != nil {
		ready <- ln.Addr().String()
	}

	return serve.Run(ctx, srv, ln, logger)
}
