package lambda_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/lambda"
)

// emfUnits are the units CloudWatch accepts in an EMF MetricDefinition.
var emfUnits = map[string]bool{
	"Seconds": true, "Microseconds": true, "Milliseconds": true, "Bytes": true, "Kilobytes": true,
	"Megabytes": true, "Gigabytes": true, "Terabytes": true, "Bits": true, "Kilobits": true,
	"Megabits": true, "Gigabits": true, "Terabits": true, "Percent": true, "Count": true,
	"Bytes/Second": true, "Kilobytes/Second": true, "Megabytes/Second": true, "Gigabytes/Second": true,
	"Terabytes/Second": true, "Bits/Second": true, "Kilobits/Second": true, "Megabits/Second": true,
	"Gigabits/Second": true, "Terabits/Second": true, "Count/Second": true, "None": true,
}

// validateEMF checks one log line against the Embedded Metric Format
// specification: a JSON object whose _aws member holds a Timestamp in
// milliseconds and CloudWatchMetrics directives (a Namespace, Dimensions as
// arrays of at most 30 names that are top-level string members, and at most
// 100 Metrics with a Name that is a top-level numeric member and a valid
// Unit). It returns the object.
func validateEMF(t *testing.T, line []byte, from, to time.Time) map[string]any {
	t.Helper()
	var root map[string]any
	if err := json.Unmarshal(line, &root); err != nil {
		t.Fatalf("not a JSON object: %v: %s", err, line)
	}
	aws, ok := root["_aws"].(map[string]any)
	if !ok {
		t.Fatalf("no _aws object: %s", line)
	}
	ts, ok := aws["Timestamp"].(float64)
	if !ok || ts != float64(int64(ts)) || int64(ts) < from.UnixMilli() || int64(ts) > to.UnixMilli() {
		t.Fatalf("_aws.Timestamp %v is not milliseconds between %d and %d", aws["Timestamp"], from.UnixMilli(), to.UnixMilli())
	}
	directives, ok := aws["CloudWatchMetrics"].([]any)
	if !ok || len(directives) == 0 {
		t.Fatalf("_aws.CloudWatchMetrics %v is not a non-empty array", aws["CloudWatchMetrics"])
	}
	for _, d := range directives {
		d, ok := d.(map[string]any)
		if !ok {
			t.Fatalf("directive %v is not an object", d)
		}
		if ns, ok := d["Namespace"].(string); !ok || ns == "" || len(ns) > 255 {
			t.Fatalf("Namespace %v", d["Namespace"])
		}
		dimSets, ok := d["Dimensions"].([]any)
		if !ok {
			t.Fatalf("Dimensions %v is not an array", d["Dimensions"])
		}
		for _, set := range dimSets {
			names, ok := set.([]any)
			if !ok || len(names) == 0 || len(names) > 30 {
				t.Fatalf("dimension set %v is not an array of 1 to 30 names", set)
			}
			for _, n := range names {
				n, _ := n.(string)
				v, ok := root[n].(string)
				if !ok || v == "" || len(v) > 1024 {
					t.Fatalf("dimension %q has no top-level string value of 1 to 1024 bytes: %v", n, root[n])
				}
			}
		}
		metrics, ok := d["Metrics"].([]any)
		if !ok || len(metrics) == 0 || len(metrics) > 100 {
			t.Fatalf("Metrics %v is not an array of 1 to 100 definitions", d["Metrics"])
		}
		for _, m := range metrics {
			m, _ := m.(map[string]any)
			name, _ := m["Name"].(string)
			if name == "" || len(name) > 1024 {
				t.Fatalf("metric name %v", m["Name"])
			}
			if _, ok := root[name].(float64); !ok {
				t.Fatalf("metric %s has no top-level numeric value: %v", name, root[name])
			}
			if unit, _ := m["Unit"].(string); !emfUnits[unit] {
				t.Fatalf("metric %s: unit %v", name, m["Unit"])
			}
		}
	}
	return root
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// switchable fails while err is set.
type switchable struct {
	ratekit.Limiter
	err error
}

func (s *switchable) Policy() ratekit.Policy { return ratekit.Policy{Name: "api"} }

func (s *switchable) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if s.err != nil {
		return ratekit.Decision{}, s.err
	}
	return s.Limiter.Allow(ctx, req)
}

func TestEMFObserver(t *testing.T) {
	var buf syncBuffer
	obs, err := lambda.NewEMFObserver(lambda.EMFConfig{Logger: slog.New(slog.NewJSONHandler(&buf, nil)), Namespace: "ratekit/test"})
	if err != nil {
		t.Fatal(err)
	}
	c := newClock()
	primary := &switchable{Limiter: window(t, 2, c)}
	g := guard(t, httplimit.GuardConfig{
		Limiter:  ratekit.Observe(primary, obs),
		OnError:  httplimit.UseFallback,
		Fallback: ratekit.Observe(failing{}, obs), // reports no policy name
		Observer: obs,
	})
	from := time.Now()
	storeDown := errors.New("redis: connection refused")
	state := "" // the signed-window token the client sends back
	for i, s := range []struct {
		err    error
		status int
	}{
		{nil, 0}, {nil, 0}, {nil, 429},
		{storeDown, 503},
		{fmt.Errorf("redis: %w", context.DeadlineExceeded), 503},
	} {
		primary.err = s.err
		res := g.Check(context.Background(), ratekit.Request{Key: "198.51.100.9", Cost: 1, State: state}, http.Header{})
		state = res.Decision.State
		if res.Status != s.status {
			t.Fatalf("step %d: status %d, want %d", i, res.Status, s.status)
		}
	}
	to := time.Now()

	type line struct {
		msg, policy, op, outcome, action, errType string
		storeErrors                               bool
	}
	want := []line{
		{msg: "ratekit decision", policy: "api", op: "allow", outcome: "allowed"},
		{msg: "ratekit decision", policy: "api", op: "allow", outcome: "allowed"},
		{msg: "ratekit decision", policy: "api", op: "allow", outcome: "denied"},
		{msg: "ratekit decision", policy: "api", op: "allow", outcome: "error", errType: "store", storeErrors: true},
		{msg: "ratekit decision", policy: "unknown", op: "allow", outcome: "error", errType: "store", storeErrors: true},
		{msg: "ratekit failure policy", policy: "api", action: "fail_closed", errType: "store"},
		{msg: "ratekit decision", policy: "api", op: "allow", outcome: "error", errType: "deadline", storeErrors: true},
		{msg: "ratekit decision", policy: "unknown", op: "allow", outcome: "error", errType: "store", storeErrors: true},
		{msg: "ratekit failure policy", policy: "api", action: "fail_closed", errType: "deadline"},
	}
	sc := bufio.NewScanner(bytes.NewReader(buf.b.Bytes()))
	var got []line
	for sc.Scan() {
		raw := sc.Bytes()
		if bytes.Contains(raw, []byte("198.51.100.9")) || bytes.Contains(raw, []byte("refused")) {
			t.Errorf("line leaks a key or an error message: %s", raw)
		}
		root := validateEMF(t, raw, from, to)
		s := func(k string) string { v, _ := root[k].(string); return v }
		l := line{msg: s("msg"), policy: s("Policy"), op: s("Operation"), outcome: s("Outcome"), action: s("Action"), errType: s("ErrorType")}
		_, l.storeErrors = root["StoreErrors"]
		got = append(got, l)
		aws := root["_aws"].(map[string]any)
		d := aws["CloudWatchMetrics"].([]any)[0].(map[string]any)
		if d["Namespace"] != "ratekit/test" {
			t.Errorf("namespace %v", d["Namespace"])
		}
		switch l.msg {
		case "ratekit decision":
			if root["Decisions"] != 1.0 {
				t.Errorf("Decisions = %v, want 1", root["Decisions"])
			}
			if ms, _ := root["DecisionLatency"].(float64); ms < 0 || ms > float64(to.Sub(from).Milliseconds()+1) {
				t.Errorf("DecisionLatency = %v ms, outside the test's %v", ms, to.Sub(from))
			}
			if n := len(d["Metrics"].([]any)); n != 2+boolInt(l.storeErrors) {
				t.Errorf("%d metric definitions, want %d", n, 2+boolInt(l.storeErrors))
			}
		case "ratekit failure policy":
			if root["FailurePolicyEvents"] != 1.0 {
				t.Errorf("FailurePolicyEvents = %v, want 1", root["FailurePolicyEvents"])
			}
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(got), len(want), buf.b.String())
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestEMFNamespace(t *testing.T) {
	for _, ns := range []string{"", "ratekit", "MyApp/RateLimits", "a.b-c_d/e#f:g", strings.Repeat("n", 255)} {
		if _, err := lambda.NewEMFObserver(lambda.EMFConfig{Namespace: ns}); err != nil {
			t.Errorf("namespace %q: %v", ns, err)
		}
	}
	for _, ns := range []string{"AWS/Lambda", "with space", "quo\"te", "ünï", strings.Repeat("n", 256), "new\nline"} {
		if _, err := lambda.NewEMFObserver(lambda.EMFConfig{Namespace: ns}); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("namespace %q: %v, want ErrInvalidConfig", ns, err)
		}
	}
}
