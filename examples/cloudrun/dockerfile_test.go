package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDockerfileBuildsFromAClone replays the build stage of the Dockerfile
// without Docker: the files git tracks (what a fresh clone holds) are the
// build context, each COPY copies from it into a scratch /src, and each RUN
// runs there in order, with absolute output paths moved into the scratch
// directory. It fails when a step reads a file that an earlier COPY did not
// bring, as `go mod download` does when a replace target's go.mod is
// missing.
func TestDockerfileBuildsFromAClone(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the container's binary")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", repo, "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	context := t.TempDir()
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if _, err := os.Lstat(filepath.Join(repo, f)); err != nil {
			continue // deleted in the working tree
		}
		copyFile(t, filepath.Join(repo, f), filepath.Join(context, f))
	}

	scratch := t.TempDir()
	workdir := scratch
	dockerfile, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(dockerfile))
	stage := 0
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch fields[0] {
		case "FROM":
			stage++
		case "WORKDIR":
			workdir = filepath.Join(scratch, fields[1])
			os.MkdirAll(workdir, 0o755)
		case "COPY":
			if stage != 1 {
				continue // the runtime stage copies the binary only
			}
			srcs, dst := fields[1:len(fields)-1], fields[len(fields)-1]
			for _, src := range srcs {
				from := filepath.Join(context, src)
				to := filepath.Join(workdir, dst)
				if strings.HasSuffix(dst, "/") {
					to = filepath.Join(to, filepath.Base(src))
				}
				if src == "." {
					to = filepath.Join(workdir, dst)
				}
				info, err := os.Stat(from)
				if err != nil {
					t.Fatalf("COPY %s: not in a fresh clone: %v", src, err)
				}
				if info.IsDir() {
					copyTree(t, from, to)
				} else {
					copyFile(t, from, to)
				}
			}
		case "RUN":
			if stage != 1 {
				continue
			}
			cmd := strings.TrimSpace(strings.TrimPrefix(sc.Text(), "RUN"))
			cmd = strings.ReplaceAll(cmd, " /quote ", " "+filepath.Join(scratch, "quote")+" ")
			c := exec.Command("sh", "-c", cmd)
			c.Dir = workdir
			// The scratch tree has no workspace and nothing above it.
			c.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
			if out, err := c.CombinedOutput(); err != nil {
				t.Fatalf("RUN %s: %v\n%s", cmd, err, out)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(scratch, "quote")); err != nil {
		t.Fatalf("the build stage made no /quote: %v", err)
	}
}

func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.Walk(from, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		copyFile(t, p, filepath.Join(to, rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
