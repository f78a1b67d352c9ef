// Package deps_test checks what ratekit's library modules require, so that a
// program that imports one of them gets its client library and nothing that
// only ratekit's tests, benchmarks or examples use.
package deps_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// direct lists, for every library module (by directory from the
// repository's root), the modules its go.mod may require directly.
var direct = map[string][]string{
	".":                    {},
	"durable":              {"github.com/jackc/pgx/v5", "github.com/ratekit/ratekit"},
	"lambda":               {"github.com/aws/aws-lambda-go", "github.com/ratekit/ratekit"},
	"breaker":              {"github.com/ratekit/ratekit", "github.com/sony/gobreaker/v2"},
	"otelratekit":          {"github.com/ratekit/ratekit", "go.opentelemetry.io/otel", "go.opentelemetry.io/otel/metric", "go.opentelemetry.io/otel/trace"},
	"kvstore/dynamostore":  {"github.com/aws/aws-sdk-go-v2", "github.com/aws/aws-sdk-go-v2/service/dynamodb", "github.com/aws/smithy-go", "github.com/ratekit/ratekit"},
	"kvstore/redisstore":   {"github.com/ratekit/ratekit", "github.com/redis/go-redis/v9"},
	"kvstore/rueidisstore": {"github.com/ratekit/ratekit", "github.com/redis/rueidis"},
}

func TestLibraryModulesRequireOnlyTheirClients(t *testing.T) {
	for dir, allowed := range direct {
		b, err := os.ReadFile(filepath.Join("..", "..", "..", dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		reqs := requires(string(b))
		if len(reqs) == 0 && len(allowed) > 0 {
			t.Errorf("%s/go.mod: no direct requirement found", dir)
		}
		for _, r := range reqs {
			if !slices.Contains(allowed, r) {
				t.Errorf("%s/go.mod requires %s directly", dir, r)
			}
		}
	}
}

// requires returns the modules that the go.mod text gomod requires and
// does not mark "// indirect".
func requires(gomod string) []string {
	var out []string
	block := false
	for _, line := range strings.Split(gomod, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "require (":
			block = true
			continue
		case block && line == ")":
			block = false
			continue
		case strings.HasPrefix(line, "require "):
			line = strings.TrimPrefix(line, "require ")
		case !block:
			continue
		}
		if f := strings.Fields(line); len(f) >= 2 && !strings.Contains(line, "// indirect") {
			out = append(out, f[0])
		}
	}
	return out
}
