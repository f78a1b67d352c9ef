package signedwindow_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/signedwindow"
)

// exampleSecret stands in for 32 random bytes from a secret manager.
var exampleSecret = []byte("an example secret of 32 bytes!!!")

// A client that sends back the token it was given is held to the limit; one
// that sends none starts afresh, and the decision says why.
func Example() {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	limiter, err := signedwindow.New(signedwindow.Config{
		Name:   "contact-form",
		Quota:  2,
		Window: time.Minute,
		Keys:   []signedwindow.Key{{ID: 1, Secret: exampleSecret}},
		Now:    func() time.Time { return now },
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	token := "" // what the client stores (a cookie, a header)
	for i := 1; i <= 3; i++ {
		d, err := limiter.Allow(ctx, ratekit.Request{Key: "203.0.113.7", Cost: 1, State: token})
		if err != nil {
			panic(err)
		}
		fmt.Printf("request %d: allowed=%v remaining=%d retry-after=%v token-error=%v\n",
			i, d.Allowed, d.Remaining, d.RetryAfter, d.StateError)
		token = d.State
		now = now.Add(10 * time.Second)
	}
	// Output:
	// request 1: allowed=true remaining=1 retry-after=0s token-error=signedwindow: no token
	// request 2: allowed=true remaining=0 retry-after=0s token-error=<nil>
	// request 3: allowed=false remaining=0 retry-after=40s token-error=<nil>
}

// The contact-form flow: the page (GET) carries a proof-of-work challenge
// whose difficulty depends on how many messages the client has sent in its
// window; the form post (POST) is counted only with a valid solution.
func ExampleLimiter_NewChallenge() {
	limiter, err := signedwindow.New(signedwindow.Config{
		Name:   "contact-form",
		Quota:  5,
		Window: time.Minute,
		Keys:   []signedwindow.Key{{ID: 1, Secret: exampleSecret}},
		// Small numbers so that the example runs fast; see DefaultDifficulty.
		Difficulty: &signedwindow.DifficultyPolicy{Base: 4, Free: 1, Step: 2, Max: 12},
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	ip := "203.0.113.7"
	cookie := ""

	for post := 1; post <= 3; post++ {
		// GET /: peek at the count, issue a challenge to match.
		d, err := limiter.Peek(ctx, ratekit.Request{Key: ip, Cost: 1, State: cookie})
		if err != nil {
			panic(err)
		}
		cookie = d.State
		ch, err := limiter.NewChallenge(ip, limiter.Difficulty(d.Quota-d.Remaining))
		if err != nil {
			panic(err)
		}

		// In the browser: a Web Crypto loop (see Challenge); here, Solve.
		solution, err := signedwindow.Solve(ctx, ch.Value)
		if err != nil {
			panic(err)
		}

		// POST /contact: check the work against the count now, then count.
		d, err = limiter.Peek(ctx, ratekit.Request{Key: ip, Cost: 1, State: cookie})
		if err != nil {
			panic(err)
		}
		if err := limiter.VerifySolution(solution, ip, limiter.Difficulty(d.Quota-d.Remaining)); err != nil {
			fmt.Println("rejected:", err)
			continue
		}
		d, err = limiter.Allow(ctx, ratekit.Request{Key: ip, Cost: 1, State: cookie})
		if err != nil {
			panic(err)
		}
		cookie = d.State
		fmt.Printf("post %d: difficulty %d bits, allowed=%v, remaining=%d\n", post, ch.Difficulty, d.Allowed, d.Remaining)
	}

	// A solution of an easy challenge fetched earlier does not do once the
	// count has risen.
	easy, _ := limiter.NewChallenge(ip, limiter.Difficulty(0))
	solution, _ := signedwindow.Solve(ctx, easy.Value)
	err = limiter.VerifySolution(solution, ip, limiter.Difficulty(3))
	fmt.Println(errors.Is(err, signedwindow.ErrDifficultyTooLow))
	// Output:
	// post 1: difficulty 4 bits, allowed=true, remaining=4
	// post 2: difficulty 6 bits, allowed=true, remaining=3
	// post 3: difficulty 8 bits, allowed=true, remaining=2
	// true
}

// A nonce proves that the client fetched something from this policy, for
// this subject, within the last NonceLifetime (10 seconds by default).
func ExampleLimiter_NewNonce() {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	limiter, err := signedwindow.New(signedwindow.Config{
		Name:   "newsletter",
		Quota:  3,
		Window: time.Hour,
		Keys:   []signedwindow.Key{{ID: 1, Secret: exampleSecret}},
		Now:    func() time.Time { return now },
	})
	if err != nil {
		panic(err)
	}
	nonce, err := limiter.NewNonce("203.0.113.7")
	if err != nil {
		panic(err)
	}
	fmt.Println(limiter.VerifyNonce(nonce, "203.0.113.7"))
	fmt.Println(errors.Is(limiter.VerifyNonce(nonce, "198.51.100.1"), signedwindow.ErrTokenInvalid))
	now = now.Add(11 * time.Second)
	fmt.Println(errors.Is(limiter.VerifyNonce(nonce, "203.0.113.7"), signedwindow.ErrTokenExpired))
	// Output:
	// <nil>
	// true
	// true
}

// A paid call whose downstream work failed gives its units back.
func ExampleLimiter_Refund() {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	limiter, err := signedwindow.New(signedwindow.Config{
		Name:   "render",
		Quota:  10,
		Window: time.Hour,
		Keys:   []signedwindow.Key{{ID: 1, Secret: exampleSecret}},
		Now:    func() time.Time { return now },
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	d, _ := limiter.Allow(ctx, ratekit.Request{Key: "api-key-42", Cost: 4})
	fmt.Println("after the call:", d.Remaining)
	d, _ = limiter.Refund(ctx, ratekit.Request{Key: "api-key-42", Cost: 4, State: d.State})
	fmt.Println("after the refund:", d.Remaining)
	// Output:
	// after the call: 6
	// after the refund: 10
}

// Rotation: the new key signs, the old one still verifies until removed.
func ExampleConfig_keys() {
	oldKey := signedwindow.Key{ID: 1, Secret: exampleSecret}
	newKey := signedwindow.Key{ID: 2, Secret: []byte("the next secret, also 32 bytes!!")}
	cfg := signedwindow.Config{Name: "api", Quota: 100, Window: time.Minute, Keys: []signedwindow.Key{oldKey}}
	before, _ := signedwindow.New(cfg)
	cfg.Keys = []signedwindow.Key{newKey, oldKey}
	during, _ := signedwindow.New(cfg)
	cfg.Keys = []signedwindow.Key{newKey}
	after, _ := signedwindow.New(cfg)

	ctx := context.Background()
	d, _ := before.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
	old := d.State
	d, _ = during.Allow(ctx, ratekit.Request{Key: "k", Cost: 1, State: old})
	tok, _ := signedwindow.ParseToken(d.State)
	fmt.Println("during:", d.StateError, "count", tok.Count, "signed by key", tok.KeyID)
	d, _ = after.Allow(ctx, ratekit.Request{Key: "k", Cost: 1, State: old})
	fmt.Println("after:", d.StateError)
	// Output:
	// during: <nil> count 2 signed by key 2
	// after: signedwindow: token signed by an unknown key
}
