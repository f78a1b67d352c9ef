// Package quickstart_test runs the README's quick-start shell block as
// written, from the repository's root, and checks that it shows what the
// README says: five posts admitted, the sixth refused with 429 and the
// RateLimit fields.
package quickstart_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratekit/ratekit/internal/testenv"
)

func TestReadmeQuickStart(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		if testenv.InCI() {
			t.Fatal("curl not found; CI must install it")
		}
		t.Skip("curl not found")
	}
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := ""
	var cur *strings.Builder
	sc := bufio.NewScanner(strings.NewReader(string(readme)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && line == "```sh":
			cur = &strings.Builder{}
		case cur != nil && line == "```":
			if strings.Contains(cur.String(), "-pow=false") {
				block = cur.String()
			}
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		}
	}
	if block == "" {
		t.Fatal("the README has no quick-start block that posts with -pow=false")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", block)
	cmd.Dir = "../../.."
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	// Its own process group, so that a server the block started is
	// stopped even when the block fails before its own kill.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	defer func() {
		if cmd.Process != nil {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's block failed: %v\n%s", err, out)
	}
	var statuses []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "HTTP/") {
			statuses = append(statuses, strings.Fields(line)[1])
		}
	}
	if len(statuses) != 6 || statuses[5] != "429" {
		t.Fatalf("statuses %v, want five answers and then 429\n%s", statuses, out)
	}
	for _, s := range statuses[:5] {
		if s == "429" || s[0] == '5' || s[0] == '4' {
			t.Fatalf("statuses %v: one of the first five was refused\n%s", statuses, out)
		}
	}
	for _, want := range []string{`RateLimit-Policy: "contact-form";q=5;w=60`, `RateLimit: "contact-form";r=0;t=`, "Retry-After: "} {
		if !strings.Contains(strings.ReplaceAll(string(out), "Ratelimit", "RateLimit"), want) {
			t.Errorf("the output lacks %q\n%s", want, out)
		}
	}
}
