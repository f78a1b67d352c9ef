package outage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

// clock is a fake clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// lines returns the JSON lines written since the last call.
func (b *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(b.b.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	b.b.Reset()
	return out
}

func newReporter(interval time.Duration) (*Reporter, *clock, *syncBuffer) {
	c := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	buf := &syncBuffer{}
	r := New(Config{Logger: slog.New(slog.NewJSONHandler(buf, nil)), Store: "PostgreSQL", Interval: interval, Now: c.Now})
	return r, c, buf
}

var errRefused = errors.New(`failed to connect to "user=postgres database=test": dial tcp 127.0.0.1:1: connect: connection refused`)

func failure(err error) ratekit.FailureEvent {
	return ratekit.FailureEvent{Policy: "paid-tier", Action: ratekit.FailedClosed, ErrorClass: ratekit.ClassifyError(err), Err: err}
}

func TestFirstFailureThenSummaries(t *testing.T) {
	r, c, buf := newReporter(30 * time.Second)

	// The first failure is logged at once, with its cause; the 999 after
	// it within the interval are only counted.
	for range 1000 {
		r.Failure(failure(errRefused))
	}
	lines := buf.lines(t)
	if len(lines) != 1 {
		t.Fatalf("1000 failures at once wrote %d lines, want 1: %v", len(lines), lines)
	}
	first := lines[0]
	if first["level"] != "ERROR" || !strings.Contains(first["msg"].(string), "PostgreSQL failed") ||
		!strings.Contains(first["msg"].(string), "503") || first["error"] != errRefused.Error() ||
		first["error_class"] != "store" || first["action"] != "fail_closed" || first["policy"] != "paid-tier" {
		t.Fatalf("first line %v", first)
	}

	// Within the interval: nothing more, however many failures.
	c.Add(29 * time.Second)
	for range 500 {
		r.Failure(failure(errRefused))
	}
	if lines := buf.lines(t); len(lines) != 0 {
		t.Fatalf("failures within the interval wrote %v", lines)
	}

	// The first failure an interval after the first line writes one
	// summary with the count since that line (999 + 500 + itself).
	c.Add(time.Second)
	later := errors.New("dial tcp 127.0.0.1:1: i/o timeout")
	r.Failure(failure(later))
	r.Failure(failure(later))
	lines = buf.lines(t)
	if len(lines) != 1 || !strings.Contains(lines[0]["msg"].(string), "still failing") ||
		lines[0]["failures"] != float64(1500) || lines[0]["error"] != later.Error() || lines[0]["failing_for"] != "30s" {
		t.Fatalf("summary %v", lines)
	}

	// Answers within the interval of the summary wait; the first answer an
	// interval after it ends the outage, with the one failure not yet
	// counted.
	c.Add(10 * time.Second)
	r.Answered()
	if lines := buf.lines(t); len(lines) != 0 {
		t.Fatalf("an answer within the interval wrote %v", lines)
	}
	c.Add(20 * time.Second)
	r.Answered()
	r.Answered()
	lines = buf.lines(t)
	if len(lines) != 1 || lines[0]["level"] != "INFO" || !strings.Contains(lines[0]["msg"].(string), "answers again") ||
		lines[0]["failures_since_last_line"] != float64(1) || lines[0]["outage"] != "1m0s" {
		t.Fatalf("recovery %v", lines)
	}

	// Healthy: answers write nothing.
	for range 100 {
		r.Answered()
	}
	if lines := buf.lines(t); len(lines) != 0 {
		t.Fatalf("answers of a healthy store wrote %v", lines)
	}

	// A new outage an interval after the last line is logged at once.
	c.Add(time.Minute)
	r.Failure(failure(errRefused))
	if lines := buf.lines(t); len(lines) != 1 || !strings.Contains(lines[0]["msg"].(string), "PostgreSQL failed") {
		t.Fatalf("second outage %v", lines)
	}
}

// A store that fails and answers in turn writes at most one line per
// interval, never one per call.
func TestFlappingIsBounded(t *testing.T) {
	r, c, buf := newReporter(30 * time.Second)
	for i := range 600 { // ten minutes, one call a second, every other one failing
		if i%2 == 0 {
			r.Failure(failure(errRefused))
		} else {
			r.Answered()
		}
		c.Add(time.Second)
	}
	if n := len(buf.lines(t)); n > 10*60/30+1 {
		t.Fatalf("ten minutes of flapping wrote %d lines, want at most one per 30 s", n)
	}
}

// A failure soon after the store answered again is counted, not logged at
// once: the bound holds across outages too.
func TestNewOutageWithinInterval(t *testing.T) {
	r, c, buf := newReporter(30 * time.Second)
	r.Failure(failure(errRefused))
	c.Add(30 * time.Second)
	r.Answered()
	if n := len(buf.lines(t)); n != 2 {
		t.Fatalf("%d lines, want the failure and the recovery", n)
	}
	c.Add(time.Second)
	r.Failure(failure(errRefused))
	if lines := buf.lines(t); len(lines) != 0 {
		t.Fatalf("a failure 1 s after the last line wrote %v", lines)
	}
	c.Add(30 * time.Second)
	r.Failure(failure(errRefused))
	lines := buf.lines(t)
	if len(lines) != 1 || lines[0]["failures"] != float64(2) || lines[0]["failing_for"] != "30s" {
		t.Fatalf("summary of the second outage %v", lines)
	}
}

func TestConcurrentFailures(t *testing.T) {
	r, _, buf := newReporter(time.Hour)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				r.Failure(failure(errRefused))
				r.Answered()
			}
		})
	}
	wg.Wait()
	if n := len(buf.lines(t)); n != 1 {
		t.Fatalf("8000 concurrent failures wrote %d lines, want 1", n)
	}
}

// The observer reports the Guard's failures and the limiter's decisions;
// a decision that failed is not an answer.
func TestObserver(t *testing.T) {
	r, c, buf := newReporter(time.Second)
	o := r.Observer()
	ctx := context.Background()
	o.FailurePolicy(ctx, failure(errRefused))
	c.Add(time.Second)
	o.Decision(ctx, ratekit.DecisionEvent{Outcome: ratekit.OutcomeError, Err: errRefused})
	if n := len(buf.lines(t)); n != 1 {
		t.Fatalf("%d lines after a failure and a failed decision, want 1", n)
	}
	o.Decision(ctx, ratekit.DecisionEvent{Outcome: ratekit.OutcomeDenied})
	if lines := buf.lines(t); len(lines) != 1 || !strings.Contains(lines[0]["msg"].(string), "answers again") {
		t.Fatalf("a denial ends the outage: %v", lines)
	}
}
