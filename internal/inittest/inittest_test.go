//go:build !wasip1 && !js

package inittest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// maxInitBytes is the most a ratekit package may allocate when it is
// initialised. Packages with nothing to initialise print no inittrace line
// at all; a few statically impossible values (an error that wraps another
// with fmt.Errorf, a copied encoding table) stay below it, while a table,
// template or regexp built at init is far above it.
const maxInitBytes = 1024

// TestNoInitWork runs noInitWork on every library module of the repository
// (as listed by .ci/modules; the examples, the benchmarks and the test-only
// modules under internal/ excepted).
func TestNoInitWork(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", filepath.Join(root, ".ci", "modules")).Output()
	if err != nil {
		t.Fatalf(".ci/modules: %v", err)
	}
	var modules []string
	for _, m := range strings.Fields(string(out)) {
		if m != "examples" && m != "benchmarks" && !strings.HasPrefix(m, "internal/") {
			modules = append(modules, m)
		}
	}
	if len(modules) < 6 {
		t.Fatalf(".ci/modules listed only %v", modules)
	}
	for _, m := range modules {
		t.Run(m, func(t *testing.T) { noInitWork(t, filepath.Join(root, m)) })
	}
}

// noInitWork builds a program that imports every library package of the
// module in dir (internal and main packages excepted), runs it with
// GODEBUG=inittrace=1 and fails for every ratekit package whose
// initialisation allocates more than maxInitBytes. Bytes are counted
// exactly, unlike time on a shared machine; the time is logged.
func noInitWork(t *testing.T, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	list := exec.CommandContext(ctx, "go", "list", "-f", `{{if ne .Name "main"}}{{.ImportPath}}{{end}}`, "./...")
	list.Dir = dir
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var imports []string
	for _, p := range strings.Fields(string(out)) {
		if !strings.Contains(p, "/internal/") {
			imports = append(imports, p)
		}
	}
	if len(imports) == 0 {
		t.Fatalf("go list found no library package in %s", dir)
	}
	var src bytes.Buffer
	src.WriteString("package main\n\nimport (\n")
	for _, p := range imports {
		fmt.Fprintf(&src, "\t_ %q\n", p)
	}
	src.WriteString(")\n\nfunc main() {}\n")

	// The program lives in an overlay: a directory of the module that
	// exists only for the build, so the source tree is not written.
	tmp := t.TempDir()
	mainPath := filepath.Join(tmp, "main.go")
	if err := os.WriteFile(mainPath, src.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	overlay, _ := json.Marshal(map[string]any{"Replace": map[string]string{filepath.Join(dir, "inittestprobe", "main.go"): mainPath}})
	overlayPath := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(overlayPath, overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(tmp, "probe")
	build := exec.CommandContext(ctx, "go", "build", "-overlay", overlayPath, "-o", bin, "./inittestprobe")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	trace, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("probe: %v\n%s", err, trace)
	}
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(trace))
	for sc.Scan() {
		// init github.com/ratekit/ratekit/x @1.2 ms, 0.05 ms clock, 432 bytes, 3 allocs
		f := strings.Fields(sc.Text())
		if len(f) != 11 || f[0] != "init" || f[8] != "bytes," {
			continue
		}
		seen++
		if !strings.HasPrefix(f[1], "github.com/ratekit/ratekit") {
			continue
		}
		n, err := strconv.Atoi(f[7])
		if err != nil {
			t.Fatalf("bad inittrace line %q", sc.Text())
		}
		t.Logf("%s: %s ms, %d bytes, %s allocs", f[1], f[4], n, f[9])
		if n > maxInitBytes {
			t.Errorf("initialising %s allocates %d bytes (%s allocs, %s ms), more than %d: build it on first use", f[1], n, f[9], f[4], maxInitBytes)
		}
	}
	if seen == 0 {
		t.Fatalf("no inittrace line in the probe's output (GODEBUG=inittrace=1 unsupported?):\n%s", trace)
	}
}
