package redisengine

import (
	"errors"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/ratekit/ratekit"
)

func TestModuleVersion(t *testing.T) {
	const store = "github.com/ratekit/ratekit/kvstore/redisstore"
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		path string
		want string
	}{
		{"no build information", nil, rootModule, "(unknown)"},
		{"a dependency", &debug.BuildInfo{Deps: []*debug.Module{{Path: store, Version: "v0.1.0"}, {Path: rootModule, Version: "v0.2.0"}}}, rootModule, "v0.2.0"},
		{"the other dependency", &debug.BuildInfo{Deps: []*debug.Module{{Path: store, Version: "v0.1.0"}, {Path: rootModule, Version: "v0.2.0"}}}, store, "v0.1.0"},
		{"replaced by a version", &debug.BuildInfo{Deps: []*debug.Module{{Path: rootModule, Version: "v0.2.0", Replace: &debug.Module{Path: "example.com/fork", Version: "v0.2.1"}}}}, rootModule, "v0.2.1"},
		{"replaced by a directory", &debug.BuildInfo{Deps: []*debug.Module{{Path: rootModule, Version: "v0.2.0", Replace: &debug.Module{Path: "../.."}}}}, rootModule, "(devel)"},
		{"the main module", &debug.BuildInfo{Main: debug.Module{Path: rootModule, Version: "(devel)"}}, rootModule, "(devel)"},
		{"the main module, no version", &debug.BuildInfo{Main: debug.Module{Path: store}}, store, "(devel)"},
		{"the main module at a tag", &debug.BuildInfo{Main: debug.Module{Path: store, Version: "v0.3.0"}}, store, "v0.3.0"},
		{"not listed", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}}, store, "(unknown)"},
	} {
		if got := moduleVersion(tc.info, tc.path); got != tc.want {
			t.Errorf("%s: moduleVersion(%s) = %q, want %q", tc.name, tc.path, got, tc.want)
		}
	}
}

// TestNewProtocol: New accepts the engine's own protocol only, and for any
// other fails with ratekit.ErrInvalidConfig, naming the store's module and
// the ratekit module with their versions and protocols.
func TestNewProtocol(t *testing.T) {
	for _, tc := range []struct {
		name     string
		protocol int
		ok       bool
	}{
		{"same", protocol, true},
		{"older store", protocol - 1, false},
		{"newer store", protocol + 1, false},
		{"unset", 0, false},
	} {
		cfg := Config{Name: "redisstore", Module: "github.com/ratekit/ratekit/kvstore/redisstore", Protocol: tc.protocol, Prefix: "p:"}
		e, err := New(&fakeConn{}, cfg)
		if tc.ok {
			if err != nil || e == nil {
				t.Errorf("%s: New: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Fatalf("%s: New: %v, want ratekit.ErrInvalidConfig", tc.name, err)
		}
		msg := err.Error()
		for _, want := range []string{
			"redisstore: invalid config: kvstore/redisstore ",
			" speaks Redis engine protocol " + itoa(tc.protocol) + ", github.com/ratekit/ratekit ",
			" speaks " + itoa(protocol) + "; require both at one release",
		} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: error %q does not contain %q", tc.name, msg, want)
			}
		}
	}
}

// TestNewConfig: a nil Conn and a prefix with a brace are configuration
// errors.
func TestNewConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		conn Conn
		cfg  Config
		want string
	}{
		{"nil conn", nil, Config{Name: "s", Protocol: protocol}, "s: invalid config: nil client"},
		{"opening brace", &fakeConn{}, Config{Name: "s", Protocol: protocol, Prefix: "a{"}, `s: invalid config: prefix "a{" contains a brace`},
		{"closing brace", &fakeConn{}, Config{Name: "s", Protocol: protocol, Prefix: "}"}, `s: invalid config: prefix "}" contains a brace`},
		{"hash tag", &fakeConn{}, Config{Name: "s", Protocol: protocol, Prefix: "{x}"}, `s: invalid config: prefix "{x}" contains a brace`},
	} {
		_, err := New(tc.conn, tc.cfg)
		if !errors.Is(err, ratekit.ErrInvalidConfig) || err.Error() != tc.want {
			t.Errorf("%s: New: %v, want %q", tc.name, err, tc.want)
		}
	}
}
