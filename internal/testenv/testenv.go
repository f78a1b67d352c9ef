// Package testenv locates the servers that ratekit's integration tests need
// (Redis, a DynamoDB API; PostgreSQL's are in durable/pgstore/pgstoretest)
// and decides what a test does when one is
// missing: outside CI it skips with a message that says how to provide it;
// in CI (the CI environment variable is set) it fails, so an integration test
// can never pass by skipping there.
package testenv

import (
	"net"
	"net/url"
	"os"
	"testing"
	"time"
)

// Environment variables that override the default addresses.
const (
	RedisEnv    = "RATEKIT_REDIS_ADDR"
	DynamoDBEnv = "RATEKIT_DYNAMODB_ENDPOINT"
)

// Default addresses: the services a development machine of this project runs
// locally.
const (
	DefaultRedisAddr = "127.0.0.1:6379"
	// DefaultDynamoDBEndpoint is dynalite, started by .ci/dynalite.sh.
	DefaultDynamoDBEndpoint = "http://127.0.0.1:8000"
)

// InCI reports whether the tests run in CI, where a missing server is a
// failure rather than a reason to skip.
func InCI() bool { return os.Getenv("CI") != "" }

// RedisAddr returns the host:port of the Redis server for tests.
func RedisAddr(t testing.TB) string {
	t.Helper()
	addr := lookup(RedisEnv, DefaultRedisAddr)
	require(t, addr, RedisEnv, "Redis")
	return addr
}

// DynamoDBEndpoint returns the URL of the DynamoDB API for tests (dynalite
// by default; a real endpoint such as https://dynamodb.eu-west-1.amazonaws.com
// when the variable names one), after checking that something listens there.
func DynamoDBEndpoint(t testing.TB) string {
	t.Helper()
	raw := lookup(DynamoDBEnv, DefaultDynamoDBEndpoint)
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		t.Fatalf("testenv: %s=%q is not a URL with a host: %v", DynamoDBEnv, raw, err)
	}
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	require(t, host, DynamoDBEnv, "DynamoDB (start dynalite with: bash .ci/dynalite.sh)")
	return raw
}

func lookup(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

func require(t testing.TB, addr, env, what string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		conn.Close()
		return
	}
	if InCI() {
		t.Fatalf("testenv: %s is not reachable at %s (%v); CI must provide it (set %s or start it in .ci/run)", what, addr, err, env)
	}
	t.Skipf("testenv: skipping, %s is not reachable at %s (%v); set %s to run this test", what, addr, err, env)
}
