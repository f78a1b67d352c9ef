package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
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
// each limiter's decisions and the guard's failure-policy events.
func newFunction(getenv func(string) string, observe observeFunc) (*function, error) {
	if observe == nil {
		observe = func(string, string) (*ratekit.Observer, error) { return nil, nil }
	}
	localObs, err := observe("tokenbucket", "memory")
	if err != nil {
		return nil, err
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil)) // Cloud Logging reads JSON lines
	mem, err := memstore.New(memstore.Config{MaxKeys: 100_000})
	if err != nil {
		return nil, err
	}
	local, err := bucket(mem)
	if err != nil {
		return nil, err
	}
	f := &function{limiter: local}
	gcfg := httplimit.GuardConfig{
		Limiter: ratekit.Observe(local, localObs),
		// The in-memory store cannot fail; this only matters for bad input,
		// which is answered with 400 anyway.
		OnError:  httplimit.FailClosed,
		Logger:   logger,
		Observer: localObs,
	}
	if url := getenv("REDIS_URL"); url != "" {
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, fmt.Errorf("REDIS_URL: %w", err)
		}
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
		gcfg.Limiter, gcfg.Observer = ratekit.Observe(f.limiter, redisObs), redisObs
		// Redis down: each instance limits on its own until it is back.
		gcfg.OnError, gcfg.Fallback = httplimit.UseFallback, ratekit.Observe(local, localObs)
		gcfg.Timeout = 300 * time.Millisecond
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
		Key:         f.key,
	})
	if err != nil {
		return nil, err
	}
	f.Handler = limit(http.HandlerFunc(quote))
	return f, nil
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
