package rueidisstore_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// rueidis client's writer and reader must end when it is closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
