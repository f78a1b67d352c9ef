package redisengine

import (
	"runtime/debug"
	"strings"
)

// protocol is the version of the engine protocol: what a store passes to
// the Engine and expects of it (Conn, Config, the methods it forwards) and
// the script arguments the Engine sends. It changes whenever a store
// written for the previous one could mis-decide or fail to build against
// this package; a store states the version it was written for as a
// literal of its own (Config.Protocol).
const protocol = 1

// rootModule is the path of the module this package belongs to.
const rootModule = "github.com/ratekit/ratekit"

// protocolError returns the error of New for a cfg.Protocol other than the
// engine's, naming the versions of both modules as the program's build
// information records them.
func protocolError(cfg Config) error {
	info, _ := debug.ReadBuildInfo()
	return configErr(cfg.Name, "%s %s speaks Redis engine protocol %d, %s %s speaks %d; require both at one release",
		strings.TrimPrefix(cfg.Module, rootModule+"/"), moduleVersion(info, cfg.Module), cfg.Protocol,
		rootModule, moduleVersion(info, rootModule), protocol)
}

// moduleVersion returns the version of the module path in info: its
// replacement's version when it is replaced by another version, "(devel)"
// when it is the main module without a version or is replaced by a
// directory, and "(unknown)" when info is nil or does not list it.
func moduleVersion(info *debug.BuildInfo, path string) string {
	if info == nil {
		return "(unknown)"
	}
	if info.Main.Path == path {
		return orDevel(info.Main.Version)
	}
	for _, m := range info.Deps {
		if m.Path != path {
			continue
		}
		if m.Replace != nil {
			return orDevel(m.Replace.Version)
		}
		return orDevel(m.Version)
	}
	return "(unknown)"
}

// orDevel returns v, or "(devel)" for an empty v.
func orDevel(v string) string {
	if v == "" {
		return "(devel)"
	}
	return v
}
