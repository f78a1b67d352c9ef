package lambda_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/lambda"
)

// TestHeaderValueCostFlat checks that HeaderValue reads a 1 MiB field of
// white space at about the cost of a short one, and that a value too long
// for an idempotency key stays too long (ratekit.Request.Validate refuses
// it) rather than being trimmed into an accepted one.
func TestHeaderValueCostFlat(t *testing.T) {
	get := lambda.HeaderValue("Idempotency-Key")
	req := func(v string) *lambda.Request {
		return &lambda.Request{Header: http.Header{"Idempotency-Key": {v}}}
	}
	short, long := req(strings.Repeat(" ", 80)), req(strings.Repeat(" ", 1<<20)+"k"+strings.Repeat(" ", 1<<20))
	perCall := func(r *lambda.Request) time.Duration {
		best := time.Duration(1<<63 - 1)
		for range 5 {
			start := time.Now()
			for range 200 {
				get(r)
			}
			best = min(best, time.Since(start)/200)
		}
		return best
	}
	if base, big := perCall(short), perCall(long); big > 20*base+time.Microsecond {
		t.Fatalf("2 MiB field costs %v per call, 80 bytes %v", big, base)
	}
	if v := get(long); len(v) <= ratekit.MaxKeyLen {
		t.Fatalf("a 2 MiB field gave a %d-byte key", len(v))
	}
	if v := get(req("  k-1  ")); v != "k-1" {
		t.Fatalf("HeaderValue = %q, want k-1", v)
	}
	padded := strings.Repeat(" ", 64) + strings.Repeat("k", ratekit.MaxKeyLen) + strings.Repeat(" ", 64)
	if v := get(req(padded)); v != strings.TrimSpace(padded) {
		t.Fatalf("HeaderValue of a padded %d-byte key: %d bytes", ratekit.MaxKeyLen, len(v))
	}
}
