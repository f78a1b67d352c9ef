package main

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	awslambda "github.com/aws/aws-lambda-go/lambda"

	"github.com/ratekit/ratekit/examples/internal/plans/planstest"
	"github.com/ratekit/ratekit/internal/itest/faultproxy"
	"github.com/ratekit/ratekit/internal/testenv"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildDir  string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "paidapi-dynamodb-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// command builds the command for this machine, once for all tests.
func command(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binPath = filepath.Join(buildDir, "paidapi-dynamodb")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// cleanEnv is the test's environment without anything that points an AWS
// SDK or aws-lambda-go somewhere (endpoints, profiles, credentials, the
// Runtime API), plus extra.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "AWS_") || name == "_LAMBDA_SERVER_PORT" || name == EndpointEnv {
			continue
		}
		env = append(env, kv)
	}
	env = append(env,
		// No shared config or credentials files of the machine.
		"AWS_CONFIG_FILE="+filepath.Join(buildDir, "no-config"),
		"AWS_SHARED_CREDENTIALS_FILE="+filepath.Join(buildDir, "no-credentials"),
		"AWS_EC2_METADATA_DISABLED=true",
	)
	return append(env, extra...)
}

// credentials are dummy ones for a local DynamoDB, or the environment's
// when it names a real one.
func credentials() []string {
	if id := os.Getenv("AWS_ACCESS_KEY_ID"); id != "" {
		creds := []string{"AWS_ACCESS_KEY_ID=" + id, "AWS_SECRET_ACCESS_KEY=" + os.Getenv("AWS_SECRET_ACCESS_KEY")}
		if tok := os.Getenv("AWS_SESSION_TOKEN"); tok != "" {
			creds = append(creds, "AWS_SESSION_TOKEN="+tok)
		}
		return creds
	}
	return []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"}
}

func region() string {
	if r := os.Getenv("AWS_REGION"); r != "" {
		return r
	}
	return "us-east-1"
}

// server is a running paidapi-dynamodb -local.
type server struct {
	cmd  *exec.Cmd
	addr string
	mu   sync.Mutex
	log  bytes.Buffer
	done chan struct{}
}

func (s *server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

// startLocal starts the command with -local and args in env, and waits
// until it says where it listens.
func startLocal(t *testing.T, env []string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(command(t), append([]string{"-local", "-addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, done: make(chan struct{})}
	addrc := make(chan string, 1)
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			s.mu.Lock()
			s.log.Write(sc.Bytes())
			s.log.WriteByte('\n')
			s.mu.Unlock()
			var m struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &m) == nil && m.Msg == "paid API listening" {
				addrc <- strings.TrimPrefix(m.Addr, "http://")
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGINT)
		<-s.done
		if err := cmd.Wait(); err != nil {
			t.Errorf("paidapi-dynamodb: %v\n%s", err, s.Log())
		}
	})
	select {
	case s.addr = <-addrc:
	case <-s.done:
		t.Fatalf("paidapi-dynamodb exited before listening:\n%s", s.Log())
	case <-time.After(3 * time.Minute):
		t.Fatalf("paidapi-dynamodb did not listen within 3 minutes:\n%s", s.Log())
	}
	return s
}

func (s *server) get(t *testing.T, apiKey string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+s.addr+"/v1/quote?symbol=ACME", nil)
	if apiKey != "" {
		req.Header.Set("X-Api-Key", apiKey)
	}
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// The binary, run locally the way README.md says, finds dynalite through
// the AWS SDK's own endpoint variables, or through RATEKIT_DYNAMODB_ENDPOINT,
// which wins over them: a known key's call is decided (200, one token
// taken), an unknown key gets 401.
func TestLocalFindsDynamoDB(t *testing.T) {
	endpoint := testenv.DynamoDBEndpoint(t)
	dead := "http://" + deadAddr(t)
	tests := []struct {
		name string
		env  []string
	}{
		{"AWS_ENDPOINT_URL_DYNAMODB", []string{"AWS_ENDPOINT_URL_DYNAMODB=" + endpoint}},
		{"AWS_ENDPOINT_URL", []string{"AWS_ENDPOINT_URL=" + endpoint}},
		{"RATEKIT_DYNAMODB_ENDPOINT wins", []string{"AWS_ENDPOINT_URL_DYNAMODB=" + dead, "AWS_ENDPOINT_URL=" + dead, EndpointEnv + "=" + endpoint}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("key-%d-%s", i, time.Now().Format("150405.000000000"))
			env := cleanEnv(append(append(tc.env, credentials()...),
				"AWS_REGION="+region(), "RATEKIT_TABLE="+testTable, "PAIDAPI_CUSTOMERS_TABLE="+testCustomersTable,
				"PAIDAPI_KEYS=other,"+key+"=pro")...)
			// A patient timeout: dynalite on a loaded machine is no DynamoDB.
			s := startLocal(t, env, "-create-table", "-timeout", "30s", "-prefix", planstest.Unique("local"))
			resp, body := s.get(t, key)
			var got struct {
				Left int64 `json:"calls_left_this_month"`
			}
			if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &got) != nil || got.Left != 99_999 ||
				!strings.Contains(resp.Header.Get("RateLimit"), `"monthly";r=99999;`) {
				t.Fatalf("known key on the pro plan: %d %v %s; want 200 with 99,999 left this month\n%s", resp.StatusCode, resp.Header, body, s.Log())
			}
			for _, k := range []string{"unknown", ""} {
				if resp, body := s.get(t, k); resp.StatusCode != 401 {
					t.Fatalf("unknown key %q: %d %s; want 401", k, resp.StatusCode, body)
				}
			}
			if strings.Contains(s.Log(), `"level":"ERROR"`) {
				t.Fatalf("errors logged:\n%s", s.Log())
			}
		})
	}
}

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// With DynamoDB unreachable every call gets 503 with Retry-After (a key
// not in memory cannot be authenticated either), metered or /usage, and the
// log says why in one line however many calls fail.
func TestOutage(t *testing.T) {
	client, _ := testClient(t, "http://"+deadAddr(t), false)
	var log bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&log, nil))
	a, err := newAPI(config{client: client, table: "t", customersTable: "c", prefix: "p", tiers: planstest.Default("").Tiers,
		timeout: 2 * time.Second, logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	h := awslambda.NewHandler(a.Route)
	const calls = 10
	for i := 0; i < calls; i++ {
		r := planstest.Call(t, h, "customer", "ACME", "")
		if i%2 == 1 {
			r = planstest.Request(t, h, "GET", "/usage", "customer", "")
		}
		if r.Status != 503 || r.Header.Get("Retry-After") == "" {
			t.Fatalf("call %d with DynamoDB down: %d %v %s; want 503 with Retry-After", i, r.Status, r.Header, r.Body)
		}
	}
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	var m struct{ Level, Msg, Error, Store string }
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &m) != nil || m.Level != "ERROR" ||
		!strings.HasPrefix(m.Msg, "DynamoDB failed") || m.Store != "DynamoDB" || !strings.Contains(m.Error, "connect") {
		t.Fatalf("%d failed calls logged:\n%s\nwant one ERROR line with the cause", calls, log.String())
	}
}

// A DynamoDB whose connections go silent (no FIN, no RST, as behind a NAT
// that dropped the flow) fails the call with 503 within the invocation's
// deadline, once the timeout has passed: a metered call of a customer in
// memory, its /usage, and the lookup of a customer not in memory.
func TestSilentDynamoDB(t *testing.T) {
	endpoint := testenv.DynamoDBEndpoint(t)
	relay := faultproxy.StartRelay(t, strings.TrimPrefix(endpoint, "http://"))
	client, _ := testClient(t, "http://"+relay.Addr, true)
	known := planstest.Unique("known")
	// A timeout that dynalite on a loaded machine meets, far below the
	// invocation's deadline (10 s).
	const timeout = time.Second
	a := testAPI(t, client, planstest.Default(known), func(c *config) { c.timeout = timeout })
	h := awslambda.NewHandler(a.Route)
	// silence makes a call that succeeds, which leaves a connection in
	// the pool, and then silences every connection the relay holds.
	silence := func(name string) {
		for i := 0; ; i++ {
			r := planstest.Request(t, h, "GET", "/usage", known, "")
			if r.Status == 200 {
				break
			}
			if i == 4 {
				t.Fatalf("%s: before the silence: %d %s", name, r.Status, r.Body)
			}
		}
		if relay.Silence() == 0 {
			t.Fatalf("%s: no connection to silence", name)
		}
	}
	for _, tc := range []struct {
		name string
		call func() planstest.Result
	}{
		{"metered", func() planstest.Result { return planstest.Call(t, h, known, "ACME", "") }},
		{"usage", func() planstest.Result { return planstest.Request(t, h, "GET", "/usage", known, "") }},
		// A customer not in memory each time: one that an earlier round
		// looked up is remembered as unknown, and never reaches DynamoDB.
		{"customer lookup", func() planstest.Result { return planstest.Call(t, h, planstest.Unique("unknown"), "ACME", "") }},
	} {
		// The relay relays a connection it accepts after the silence,
		// and the transport dials one when the pooled connection is not
		// back in its pool yet or was closed: a call that answered on a
		// new connection did not meet a silent one, and the round runs
		// again (on a loaded machine, three times in a row was seen).
		for attempt := 1; ; attempt++ {
			silence(tc.name)
			accepted := relay.Accepted()
			start := time.Now()
			r := tc.call()
			took := time.Since(start)
			if r.Status != 503 && relay.Accepted() > accepted {
				if attempt == 5 {
					t.Fatalf("%s: %d calls in a row went over a new connection, none over the silenced one", tc.name, attempt)
				}
				t.Logf("%s: the call went over a new connection (%d %s); again", tc.name, r.Status, r.Body)
				continue
			}
			if r.Status != 503 || r.Header.Get("Retry-After") == "" || took > timeout+time.Second {
				t.Fatalf("%s on a silent DynamoDB: %d %s after %v; want 503 with Retry-After within the %v timeout", tc.name, r.Status, r.Body, took, timeout)
			}
			break
		}
	}
}

// Outside Lambda without -local the command says what to do in one line
// and exits 2; -h exits 0; a mistake on the command line exits 2, once.
func TestCommandLine(t *testing.T) {
	bin := command(t)
	tests := []struct {
		args   []string
		status int
		out    string // printed exactly once
		whole  bool   // and nothing else
	}{
		{nil, 2, "paidapi-dynamodb: not running in AWS Lambda (AWS_LAMBDA_RUNTIME_API is unset): run with -local to serve on localhost\n", true},
		{[]string{"-h"}, 0, "Usage: paidapi-dynamodb", false},
		{[]string{"-timeout", "-1s"}, 2, `invalid value "-1s" for flag -timeout: must be from 1ms to 1m0s`, false},
		{[]string{"-create-table"}, 2, "paidapi-dynamodb: -create-table works with -local only", false},
		{[]string{"-bill", "2026-11-01"}, 2, `invalid value "2026-11-01" for flag -bill: want from/to`, false},
		{[]string{"-bill", "2026-12-01/2026-11-01"}, 2, "from must be before to", false},
		{[]string{"-local", "-bill", "2026-11-01/2026-12-01"}, 2, "-bill prints and exits", false},
		{[]string{"-quota", "0"}, 2, `invalid value "0" for flag -quota`, false},
	}
	for _, tc := range tests {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = cleanEnv("RATEKIT_TABLE=t", "PAIDAPI_CUSTOMERS_TABLE=c", "PAIDAPI_KEYS=k", "AWS_REGION=us-east-1")
		out, err := cmd.CombinedOutput()
		status := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			status = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		ok := strings.Count(string(out), tc.out) == 1
		if tc.whole {
			ok = string(out) == tc.out
		}
		if status != tc.status || !ok {
			t.Errorf("%q: exit %d, output %q; want exit %d and %q", tc.args, status, out, tc.status, tc.out)
		}
	}
}

// The SAM template builds with BuildMethod: makefile: sam build runs
// examples/Makefile's build-<LogicalId> target with ARTIFACTS_DIR set, in a
// scratch copy of CodeUri. The test runs the target the same way, from an
// empty directory, and checks the bootstrap it leaves.
func TestSAMMakefile(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		if testenv.InCI() {
			t.Fatalf("make is not installed: %v", err)
		}
		t.Skipf("skipping: make is not installed (%v); sam build needs it for template.yaml", err)
	}
	tmpl, err := os.ReadFile("template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Every function of the template is built by the Makefile of its
	// CodeUri, which holds go.mod.
	fn := regexp.MustCompile(`(?m)^  (\w+):\n    Type: AWS::Serverless::Function\n    Metadata:\n      BuildMethod: makefile\n    Properties:\n      CodeUri: (\S+)\n`)
	found := fn.FindAllStringSubmatch(string(tmpl), -1)
	if len(found) != 1 || strings.Count(string(tmpl), "AWS::Serverless::Function") != 1 {
		t.Fatalf("template.yaml: want one function with BuildMethod: makefile and its CodeUri, found %q", found)
	}
	id, codeURI := found[0][1], found[0][2]
	codeDir, err := filepath.Abs(codeURI)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"Makefile", "go.mod"} {
		if _, err := os.Stat(filepath.Join(codeDir, f)); err != nil {
			t.Fatalf("CodeUri %s has no %s: %v", codeURI, f, err)
		}
	}
	artifacts := filepath.Join(t.TempDir(), "artifacts", id)
	if err := os.MkdirAll(artifacts, 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("make", "--makefile", filepath.Join(codeDir, "Makefile"), "build-"+id)
	build.Dir = t.TempDir() // SAM's scratch directory
	build.Env = append(os.Environ(), "ARTIFACTS_DIR="+artifacts)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make build-%s: %v\n%s", id, err, out)
	}
	f, err := elf.Open(filepath.Join(artifacts, "bootstrap"))
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	defer f.Close()
	if f.Machine != elf.EM_AARCH64 {
		t.Errorf("bootstrap is for %v, want arm64 (template.yaml: Architectures: [arm64])", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("bootstrap is dynamically linked; want CGO_ENABLED=0")
		}
	}
}
