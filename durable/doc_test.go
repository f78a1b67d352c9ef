package durable_test

import (
	"testing"

	"github.com/ratekit/ratekit/durable/internal/pgengine"
)

// TestDocumentedCleanupDefaults: Config.CleanupProbability and
// Limiter.Cleanup state the engine's defaults as numbers.
func TestDocumentedCleanupDefaults(t *testing.T) {
	if pgengine.DefaultCleanupProbability != 0.01 || pgengine.DefaultCleanupBatch != 500 {
		t.Errorf("engine cleanup defaults %v and %d; durable's documentation says 0.01 and 500",
			pgengine.DefaultCleanupProbability, pgengine.DefaultCleanupBatch)
	}
}
