package httplimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

// TestSetHeadersPeriod renders a decision of a monthly policy as durable
// reports it: Window is the current period's length (March 2027 in Berlin,
// 31 days less the hour clocks spring forward), w is that in whole
// seconds, and t the time to the period's true end, rounded up.
func TestSetHeadersPeriod(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("time zone: %v", err)
	}
	p := ratekit.Period{Unit: ratekit.Month, Location: berlin, Anchor: time.Date(2027, time.January, 1, 0, 0, 0, 500_000_000, berlin)}
	at := time.Date(2027, time.March, 31, 23, 59, 58, 0, berlin)
	start, end := p.Bounds(at)
	if got := end.Sub(start); got != 31*24*time.Hour-time.Hour {
		t.Fatalf("period lasts %v", got)
	}
	policy := ratekit.Policy{Name: "monthly", Quota: 100000, Algorithm: ratekit.FixedWindow, Period: p, Window: end.Sub(start)}
	h := http.Header{}
	SetHeaders(h, ratekit.Decision{Allowed: true, Quota: 100000, Remaining: 7, ResetAfter: end.Sub(at), Policy: policy}, false)
	if got, want := h.Get("RateLimit-Policy"), `"monthly";q=100000;w=2674800`; got != want {
		t.Errorf("RateLimit-Policy %s, want %s", got, want)
	}
	if got, want := h.Get("RateLimit"), `"monthly";r=7;t=3`; got != want {
		t.Errorf("RateLimit %s, want %s", got, want)
	}
}
