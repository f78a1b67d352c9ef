package rueidisstore_test

import (
	"testing"

	"github.com/ratekit/ratekit/internal/leakcheck"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// rueidis client's writer and reader must end when it is closed.
func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }
