// Package modproxy holds what the release and skew tests need to act as a
// ratekit user: copies of the repository (its working tree, or a commit), a
// file-based module proxy serving modules from such a copy, and the go
// environment of a user who fetches through that proxy.
package modproxy

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// Root is the root module's path; every ratekit module's path starts with it.
const Root = "github.com/ratekit/ratekit"

// IsRatekit reports whether path is Root or a module under it.
func IsRatekit(path string) bool {
	return path == Root || strings.HasPrefix(path, Root+"/")
}

// CopyWorkingTree copies the files of the working tree of the repository
// at repo (tracked and untracked, not ignored; not those deleted) to dst.
func CopyWorkingTree(t testing.TB, repo, dst string) {
	t.Helper()
	files := strings.Split(strings.TrimRight(MustRun(t, repo, nil, "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"), "\x00"), "\x00")
	for _, f := range files {
		src := filepath.Join(repo, f)
		info, err := os.Lstat(src)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the working tree, or a link
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		d := filepath.Join(dst, f)
		if err := os.MkdirAll(filepath.Dir(d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(d, b, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

// Archive extracts the tree of commit in the repository at repo to dst,
// failing t with hint (what to do about it) when git cannot.
func Archive(t testing.TB, repo, commit, dst, hint string) {
	t.Helper()
	c := exec.Command("sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", repo, commit, dst)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s %s: %v\n%s", commit, hint, err, out)
	}
}

// Serve adds every module of mods (module path to its directory) at
// version to the file-based module proxy in the directory proxy: its
// go.mod as the directory holds it, a zip of the directory, and the
// version appended to the module's list.
func Serve(t testing.TB, proxy, version string, mods map[string]string) {
	t.Helper()
	for path, dir := range mods {
		esc, err := module.EscapePath(path)
		if err != nil {
			t.Fatal(err)
		}
		v := filepath.Join(proxy, esc, "@v")
		if err := os.MkdirAll(v, 0o755); err != nil {
			t.Fatal(err)
		}
		modText, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		info, _ := json.Marshal(map[string]any{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
		var zbuf bytes.Buffer
		if err := zip.CreateFromDir(&zbuf, module.Version{Path: path, Version: version}, dir); err != nil {
			t.Fatalf("zip %s@%s: %v", path, version, err)
		}
		for name, data := range map[string][]byte{version + ".info": info, version + ".mod": modText, version + ".zip": zbuf.Bytes()} {
			if err := os.WriteFile(filepath.Join(v, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		list, err := os.OpenFile(filepath.Join(v, "list"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		_, err = list.WriteString(version + "\n")
		if cerr := list.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// UserEnv returns the environment of a user who fetches ratekit through
// the file proxy at proxy: that proxy first, then the machine's module
// cache and its configured proxy; a module cache of t's own (removed at
// cleanup), so that the simulated modules never mix with the machine's;
// no checksum database for ratekit's modules; -mod=mod; no workspace; the
// local toolchain.
func UserEnv(t testing.TB, proxy string) []string {
	t.Helper()
	upstream := strings.TrimSpace(MustRun(t, "", nil, "go", "env", "GOPROXY"))
	cache := filepath.Join(strings.TrimSpace(MustRun(t, "", nil, "go", "env", "GOMODCACHE")), "cache", "download")
	modcache := t.TempDir()
	t.Cleanup(func() {
		c := exec.Command("go", "clean", "-modcache")
		c.Env = append(os.Environ(), "GOMODCACHE="+modcache)
		c.Run()
	})
	return append(os.Environ(),
		"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(cache)+","+upstream,
		"GOMODCACHE="+modcache,
		"GONOSUMDB="+Root,
		"GOFLAGS=-mod=mod",
		"GOWORK=off",
		"GOTOOLCHAIN=local",
	)
}

// Run runs a command in dir (the current directory when empty) with env
// (the process's own when nil) and returns its combined output.
func Run(dir string, env []string, args ...string) (string, error) {
	c := exec.Command(args[0], args[1:]...)
	c.Dir, c.Env = dir, env
	out, err := c.CombinedOutput()
	return string(out), err
}

// MustRun is Run failing t, with the command's output, on error.
func MustRun(t testing.TB, dir string, env []string, args ...string) string {
	t.Helper()
	out, err := Run(dir, env, args...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// FirstLines returns s's first n lines.
func FirstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
