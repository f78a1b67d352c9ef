package redisstore_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestNoMemstoreDependency checks that a program using tokenbucket over
// Redis links neither memstore nor its map package: tokenbucket finds a
// store's key spaces through kvstore.Prefixer, not a memstore type.
func TestNoMemstoreDependency(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, pkg := range []string{"github.com/ratekit/ratekit/tokenbucket", "github.com/ratekit/ratekit/kvstore/redisstore"} {
		out, err := exec.CommandContext(ctx, "go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s listed only %v", pkg, deps)
		}
		for _, d := range deps {
			if strings.HasSuffix(d, "/kvstore/memstore") || strings.Contains(d, "xsync") {
				t.Errorf("%s depends on %s", pkg, d)
			}
		}
	}
}
