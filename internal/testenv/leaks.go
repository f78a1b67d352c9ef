package testenv

import (
	"time"

	"github.com/ratekit/ratekit/internal/leakcheck"
)

// ignoreToxiproxy is the goroutine toxiproxy's latency toxic leaves parked.
const ignoreToxiproxy = "github.com/Shopify/toxiproxy/v2/toxics.(*LatencyToxic).Pipe"

// CheckLeaks reports the goroutines still running after a test binary's
// tests, waiting up to 20 s for those that are ending: a check for a
// TestMain such as pgstoretest.Main.
func CheckLeaks() error {
	err := leakcheck.Find(ignoreToxiproxy)
	for deadline := time.Now().Add(20 * time.Second); err != nil && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		err = leakcheck.Find(ignoreToxiproxy)
	}
	return err
}
