package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

const secret = "0123456789abcdef0123456789abcdef"

// build compiles the command in dir for GOOS=wasip1 and returns the
// module.
func build(tb testing.TB, dir string) []byte {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), "edge.wasm")
	cmd := exec.Command("go", "build", "-o", out, dir)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build for wasip1: %v\n%s", err, b)
	}
	wasm, err := os.ReadFile(out)
	if err != nil {
		tb.Fatal(err)
	}
	return wasm
}

// runtime compiles wasm in an embedded WASI runtime (wazero) and returns a
// function that runs one fresh instance of it per request.
func runtime(tb testing.TB, wasm []byte) func(token string) string {
	tb.Helper()
	ctx := context.Background()
	r := wazero.NewRuntime(ctx)
	tb.Cleanup(func() { r.Close(ctx) })
	wasi_snapshot_preview1.MustInstantiate(ctx, r)
	compiled, err := r.CompileModule(ctx, wasm)
	if err != nil {
		tb.Fatal(err)
	}
	return func(token string) string {
		var stdout, stderr bytes.Buffer
		cfg := wazero.NewModuleConfig().WithStdout(&stdout).WithStderr(&stderr).WithName("").
			WithEnv("RATEKIT_SECRET", secret).WithEnv("RATEKIT_TOKEN", token).WithEnv("CLIENT_IP", "192.0.2.7")
		m, err := r.InstantiateModule(ctx, compiled, cfg)
		if err != nil {
			tb.Fatalf("instance: %v\n%s", err, stderr.String())
		}
		m.Close(ctx)
		return stdout.String()
	}
}

// TestFreshInstancePerRequest: six requests, each to a fresh instance of
// the WASI module that carries nothing but the client's token, admit five
// and refuse the sixth.
func TestFreshInstancePerRequest(t *testing.T) {
	run := runtime(t, build(t, "."))
	token := ""
	var statuses []string
	for range 6 {
		out := run(token)
		statuses = append(statuses, strings.Fields(out)[1])
		for _, line := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(line, "Ratekit-Token: "); ok {
				token = v
			}
		}
		if !strings.Contains(out, `Ratelimit-Policy: "edge";q=5;w=60`) {
			t.Fatalf("no RateLimit-Policy field:\n%s", out)
		}
	}
	if strings.Join(statuses, " ") != "200 200 200 200 200 429" {
		t.Fatalf("statuses %v, want five 200 and a 429", statuses)
	}
}

// BenchmarkFreshInstance is the cost of one request to a fresh instance
// (instantiation, the decision, the answer), the module compiled once,
// beside the same answer without ratekit (the baseline command).
func BenchmarkFreshInstance(b *testing.B) {
	for _, tc := range []struct{ name, dir string }{{"edge", "."}, {"baseline", "./baseline"}} {
		b.Run(tc.name, func(b *testing.B) { benchmarkInstance(b, tc.dir) })
	}
}

func benchmarkInstance(b *testing.B, dir string) {
	run := runtime(b, build(b, dir))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		run("")
	}
}
