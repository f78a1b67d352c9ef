// Command edge is a rate-limited function for WebAssembly edge runtimes
// (GOOS=wasip1), where every request may get a fresh instance that keeps
// nothing: the client carries its count in a signed token.
//
// Each run answers one request. It reads the client's address from
// CLIENT_IP (the key the token is bound to), the client's token from
// RATEKIT_TOKEN (empty for a new client) and the shared secret from
// RATEKIT_SECRET (32 bytes or more), allows 5 requests a minute, and
// writes the answer to standard output: the status line, the RateLimit
// fields, Retry-After when it refuses, and the token to send back in
// Ratekit-Token. Build and run it with any WASI runtime, for example:
//
//	GOOS=wasip1 GOARCH=wasm go -C examples build -o edge.wasm ./edge
//	RATEKIT_SECRET=$(head -c 32 /dev/urandom | base64) wazero run -env-inherit edge.wasm
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sort"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/signedwindow"
)

func main() {
	status, header, err := answer(os.Getenv("RATEKIT_SECRET"), os.Getenv("RATEKIT_TOKEN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "edge:", err)
		os.Exit(1)
	}
	fmt.Printf("HTTP/1.1 %d %s\n", status, http.StatusText(status))
	names := make([]string, 0, len(header))
	for name := range header {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, v := range header[name] {
			fmt.Printf("%s: %s\n", name, v)
		}
	}
}

// answer decides one request of a client that carries token.
func answer(secret, token string) (int, http.Header, error) {
	if len(secret) < signedwindow.MinSecretLen {
		return 0, nil, fmt.Errorf("RATEKIT_SECRET is %d bytes; need at least %d", len(secret), signedwindow.MinSecretLen)
	}
	limiter, err := signedwindow.New(signedwindow.Config{
		Name: "edge", Quota: 5, Window: time.Minute,
		Keys: []signedwindow.Key{{ID: 1, Secret: []byte(secret)}},
	})
	if err != nil {
		return 0, nil, err
	}
	key := os.Getenv("CLIENT_IP")
	if key == "" {
		key = "client"
	}
	d, err := limiter.Allow(context.Background(), ratekit.Request{Key: key, Cost: 1, State: token})
	if err != nil {
		return 0, nil, err
	}
	h := http.Header{}
	httplimit.SetHeaders(h, d, false)
	h.Set(httplimit.DefaultStateHeader, d.State)
	if !d.Allowed {
		return http.StatusTooManyRequests, h, nil
	}
	return http.StatusOK, h, nil
}
