// Command cloudrun is a Cloud Run function written with Google's Functions
// Framework for Go: an HTTP function registered in init() under the name
// "Quote" and served by funcframework, limited per client by ratekit's
// root net/http middleware with a token bucket (burst 5, refilled at 30 a
// minute).
//
// With $REDIS_URL set (for example redis://10.0.0.3:6379/0, a Memorystore
// instance reached through a VPC connector) every instance shares the
// buckets in Redis, updated atomically by one script per request; if Redis
// fails, each instance falls back to buckets of its own in memory. Without
// $REDIS_URL the buckets live in the instance's memory, which is exact for
// one instance and per instance otherwise.
//
// Run it locally the way Cloud Run runs it:
//
//	FUNCTION_TARGET=Quote PORT=8080 go -C examples run ./cloudrun
//	curl -i localhost:8080/
//
// $FUNCTION_TARGET selects the function, $PORT the port (default 8080).
// On Cloud Run ($K_SERVICE is set) clients are keyed by the address the
// Google front end appends to X-Forwarded-For; locally by the connection's
// address. $TRUSTED_PROXIES overrides the number of trusted proxies.
package main

import (
	"log"
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
)

// init builds the limiter once per instance and registers the function, as
// a Cloud Run function's package does.
func init() {
	f, err := newFunction(os.Getenv, nil)
	if err != nil {
		log.Fatalf("cloudrun: %v", err)
	}
	functions.HTTP("Quote", f.ServeHTTP)
}

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	// An empty host listens on every interface, as Cloud Run requires.
	if err := funcframework.StartHostPort(os.Getenv("HOST"), port); err != nil {
		log.Fatalf("cloudrun: %v", err)
	}
}
