package rueidisstore_test

import (
	"testing"

	"github.com/ratekit/ratekit/internal/leakcheck"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// rueidis client's writer and reader must end when it is closed.
//
// One goroutine of rueidis's own is let go: when a cluster client's
// topology refresh replaces a node's connection (which a busy machine's
// timeouts cause), rueidis closes the old one 5 s later from a goroutine
// that Close does not stop (cluster.go, clusterClient._refresh). It ends by
// itself, but after the leak check's last look.
func TestMain(m *testing.M) {
	leakcheck.VerifyTestMain(m, "github.com/redis/rueidis.(*clusterClient)._refresh.func2")
}
