package rueidisstore_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// rueidis client's writer and reader must end when it is closed.
//
// One goroutine of rueidis's own is let go: when a cluster client's
// topology refresh replaces a node's connection (which a busy machine's
// timeouts cause), rueidis closes the old one 5 s later from a goroutine
// that Close does not stop (cluster.go, clusterClient._refresh). It ends by
// itself, but after goleak's last look.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}
