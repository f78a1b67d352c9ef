package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// policyName is the name clients see in RateLimit-Policy.
const policyName = "quote"

// function is the limited HTTP function and what it was built from.
type function struct {
	http.Handler
	limiter *tokenbucket.Limiter
	key     httplimit.KeyFunc
	redis   redis.UniversalClient // nil without REDIS_URL

	redisDown *throttledLog // Redis failures; nil without REDIS_URL
	noKey     *throttledLog // requests without a client address
}

// bucket returns a token-bucket limiter over store: 5 requests at once, one
// more every 2 seconds.
func bucket(store kvstore.Store) (*tokenbucket.Limiter, error) {
	return tokenbucket.New(tokenbucket.Config{
		Name:       policyName,
		Burst:      5,
		RefillRate: tokenbucket.PerMinute(30),
		Mode:       tokenbucket.Atomic,
		Store:      store,
	})
}

// observeFunc returns the observer of a limiter of the given strategy over
// the given store (see observers in main.go).
type observeFunc func(strategy, store string) (*ratekit.Observer, error)

// newFunction builds the function from the environment: REDIS_URL,
// REDIS_PREFIX (key prefix, default "ratekit:"), K_SERVICE and
// TRUSTED_PROXIES. observe, when not nil, makes the observer that reports
// each limiter's decisions and the guard's failure-policy events. logger
// receives the function's log; nil means JSON lines on stderr, which Cloud
// Logging reads.
func newFunction(getenv func(string) string, observe observeFunc, logger *slog.Logger) (*function, error) {
	if observe == nil {
		observe = func(string, string) (*ratekit.Observer, error) { return nil, nil }
	}
	if logger == nil {
		logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	// Check REDIS_URL before anything else, so that a mistake in it is the
	// error reported.
	var redisOpts *redis.Options
	if raw := getenv("REDIS_URL"); raw != "" {
		var err error
		if redisOpts, err = parseRedisURL(raw); err != nil {
			return nil, err
		}
	}
	localObs, err := observe("tokenbucket", "memory")
	if err != nil {
		return nil, err
	}
	mem, err := memstore.New(memstore.Config{MaxKeys: 100_000})
	if err != nil {
		return nil, err
	}
	local, err := bucket(mem)
	if err != nil {
		return nil, err
	}
	f := &function{limiter: local}
	f.noKey = &throttledLog{logger: logger, every: failureLogEvery,
		first:   "cloudrun: refused a request with 400: cannot tell its client's address (is TRUSTED_PROXIES right?)",
		summary: "cloudrun: still refusing requests with 400: cannot tell their client's address"}
	gcfg := httplimit.GuardConfig{
		Limiter: ratekit.Observe(local, localObs),
		// The in-memory store cannot fail; this only matters for bad input,
		// which is answered with 400 anyway.
		OnError:  httplimit.FailClosed,
		Logger:   logger,
		Observer: localObs,
	}
	if opts := redisOpts; opts != nil {
		// Commands honour the request's deadline and fail fast rather
		// than block for go-redis's default seconds.
		uopts := redisstore.ServerlessOptions(&redis.UniversalOptions{
			Addrs:     []string{opts.Addr},
			DB:        opts.DB,
			Username:  opts.Username,
			Password:  opts.Password,
			TLSConfig: opts.TLSConfig,
		}, 250*time.Millisecond)
		f.redis = redis.NewUniversalClient(uopts)
		store, err := redisstore.New(f.redis, redisstore.Config{Prefix: getenv("REDIS_PREFIX")})
		if err != nil {
			return nil, err
		}
		if f.limiter, err = bucket(store); err != nil {
			return nil, err
		}
		redisObs, err := observe("tokenbucket", "redis")
		if err != nil {
			return nil, err
		}
		// Redis down: each instance limits on its own until it is back.
		gcfg.OnError, gcfg.Fallback = httplimit.UseFallback, ratekit.Observe(local, localObs)
		gcfg.Timeout = 300 * time.Millisecond
		// The Guard would log a line for every request that Redis fails
		// (and go-redis another): the failure policy's events are logged
		// here instead, the first at once with its cause and then at most
		// a line per failureLogEvery with their count.
		f.redisDown = &throttledLog{logger: logger, every: failureLogEvery,
			first:   "cloudrun: Redis failed; each instance limits with buckets in its own memory until Redis answers again",
			summary: "cloudrun: Redis still failing; requests limited with buckets in each instance's memory"}
		gcfg.Limiter = ratekit.Observe(f.limiter, redisObs)
		gcfg.Observer = &ratekit.Observer{FailurePolicy: func(ctx context.Context, e ratekit.FailureEvent) {
			if redisObs != nil && redisObs.FailurePolicy != nil {
				redisObs.FailurePolicy(ctx, e)
			}
			attrs := []any{"action", e.Action.String(), "error", e.Err.Error()}
			if e.FallbackErr != nil {
				attrs = append(attrs, "fallback_error", e.FallbackErr.Error())
			}
			f.redisDown.failed(ctx, attrs...)
		}}
		gcfg.Logger = slog.New(slog.DiscardHandler)
		// go-redis logs dial failures itself, once more per request; the
		// same errors reach the Guard. Its log goes to logger at level
		// Debug, which the default handler leaves out.
		redis.SetLogger(redisLog{logger})
	}

	trusted := 0
	if getenv("K_SERVICE") != "" {
		trusted = 1 // Cloud Run's front end appends the client's address
	}
	if v := getenv("TRUSTED_PROXIES"); v != "" {
		if trusted, err = strconv.Atoi(v); err != nil || trusted < 0 {
			return nil, fmt.Errorf("TRUSTED_PROXIES=%q is not a count of proxies", v)
		}
	}
	f.key = httplimit.RemoteAddrKey()
	if trusted > 0 {
		if f.key, err = httplimit.ForwardedForKey(trusted); err != nil {
			return nil, err
		}
	}
	limit, err := httplimit.Middleware(httplimit.MiddlewareConfig{
		GuardConfig: gcfg,
		Key:         keyFromContext, // f.keyed has derived it
	})
	if err != nil {
		return nil, err
	}
	f.Handler = f.keyed(limit(http.HandlerFunc(quote)))
	return f, nil
}

// parseRedisURL checks REDIS_URL and says what is wrong with it. The URL
// is quoted with any password hidden.
func parseRedisURL(raw string) (*redis.Options, error) {
	if !strings.HasPrefix(raw, "redis://") && !strings.HasPrefix(raw, "rediss://") {
		return nil, fmt.Errorf("REDIS_URL %q is not a redis:// or rediss:// URL (for example redis://10.0.0.3:6379/0)", redactURL(raw))
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL %q: %w", redactURL(raw), err)
	}
	return opts, nil
}

// redactURL hides the user information of a URL (everything before its
// last "@", after the scheme), which may hold a password.
func redactURL(raw string) string {
	at := strings.LastIndexByte(raw, '@')
	if at < 0 {
		return raw
	}
	start := 0
	if i := strings.Index(raw, "//"); i >= 0 && i < at {
		start = i + 2
	}
	return raw[:start] + "xxxxx" + raw[at:]
}

// redisLog is go-redis's logger: its messages at level Debug.
type redisLog struct{ logger *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.logger.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}

type keyContext struct{}

// keyed derives the client's key before the limiter runs. A request
// without a usable one (on Cloud Run, fewer X-Forwarded-For entries than
// TRUSTED_PROXIES) is answered 400 with details in the client's words, and
// the reason, for developers, goes to the log: the root middleware would
// put the key function's error text in the body. The middleware reads the
// key from the context instead (keyFromContext).
func (f *function) keyed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := f.key(r)
		if err != nil {
			f.noKey.failed(r.Context(), "error", err.Error())
			w.Header().Set("Content-Type", httplimit.ProblemContentType)
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(httplimit.Problem{
				Type:   "about:blank",
				Title:  "Bad Request",
				Status: http.StatusBadRequest,
				Detail: "The server could not tell which address this request comes from, so it cannot serve it. Please try again later.",
			})
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

// quote is the function's own work.
func quote(w http.ResponseWriter, r *http.Request) {
	d, _ := httplimit.DecisionFromContext(r.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(map[string]any{
		"quote":     "Premature optimization is the root of all evil.",
		"remaining": d.Remaining,
	})
}

// failureLogEvery is the shortest time between two log lines about the same
// kind of failure (Redis failing, requests without a client address).
const failureLogEvery = 10 * time.Second

// throttledLog logs a failure that may hit every request without logging
// every request: the first failure of a run at once, with its cause, and
// then at most one line per interval, which counts the failures since the
// line before and gives the latest cause. A run ends when no failure came
// for a whole interval; the next failure is logged at once again.
type throttledLog struct {
	logger  *slog.Logger
	every   time.Duration
	first   string // the message of a run's first line
	summary string // the message of the lines that count the rest

	mu      sync.Mutex
	last    time.Time // when the last line was written
	pending int       // failures since then, not yet logged
	attrs   []any     // the latest of those failures' attributes
	timer   *time.Timer
}

// failed reports one failure; attrs (slog key-value pairs) describe it,
// its cause included.
func (l *throttledLog) failed(ctx context.Context, attrs ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.pending == 0 && (l.last.IsZero() || now.Sub(l.last) >= l.every) {
		l.last = now
		l.logger.WarnContext(ctx, l.first, attrs...)
		return
	}
	l.pending++
	l.attrs = attrs
	if l.timer == nil {
		l.timer = time.AfterFunc(l.last.Add(l.every).Sub(now), l.flush)
	}
}

// flush writes the line that counts the failures not yet logged.
func (l *throttledLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.timer = nil
	if l.pending == 0 {
		return
	}
	now := time.Now()
	// The count, the time it covers, then the latest failure's attributes.
	attrs := append([]any{"failures", l.pending, "since", now.Sub(l.last).Round(100 * time.Millisecond).String()}, l.attrs...)
	l.logger.Warn(l.summary, attrs...)
	l.last, l.pending, l.attrs = now, 0, nil
}
