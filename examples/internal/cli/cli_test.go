package cli

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit/examples/internal/lambdaenv"
)

func newFlags(out *bytes.Buffer) (*flag.FlagSet, *int64, *time.Duration, *string) {
	fs := flag.NewFlagSet("cmd", flag.ContinueOnError)
	fs.SetOutput(out)
	SetUsage(fs, "cmd [flags]", "Environment:\n  X  something\n")
	n := Int64(fs, "n", 10, 1, 100, "`count` of things")
	d := Duration(fs, "timeout", time.Second, time.Millisecond, time.Minute, "`bound` on a call")
	s := String(fs, "name", "a", "a `name`", func(s string) error {
		if s == "" {
			return errors.New("must not be empty")
		}
		return nil
	})
	return fs, n, d, s
}

func TestParse(t *testing.T) {
	tests := []struct {
		args   []string
		status int
		out    []string // each printed exactly once
		none   []string
	}{
		{args: []string{"-h"}, status: 0, out: []string{"Usage: cmd [flags]", "-n count", "Environment:"}},
		{args: []string{"-nope"}, status: 2, out: []string{"flag provided but not defined: -nope", "Usage: cmd"}},
		{args: []string{"-n", "-5"}, status: 2, out: []string{`invalid value "-5" for flag -n: must be from 1 to 100`}},
		{args: []string{"-n", "x"}, status: 2, out: []string{`invalid value "x" for flag -n: not a whole number`}},
		{args: []string{"-timeout", "0s"}, status: 2, out: []string{`invalid value "0s" for flag -timeout: must be from 1ms to 1m0s`}},
		{args: []string{"-name="}, status: 2, out: []string{`invalid value "" for flag -name: must not be empty`}},
		{args: []string{"extra"}, status: 2, out: []string{`cmd: unexpected argument "extra"`}, none: []string{"Usage"}},
		{args: []string{"-n", "100", "-timeout", "2s", "-name", "b"}, status: 0, none: []string{"cmd"}},
	}
	for _, tc := range tests {
		var out bytes.Buffer
		fs, _, _, _ := newFlags(&out)
		err := Parse(fs, tc.args)
		if status := Exit("cmd", err, &out); status != tc.status {
			t.Errorf("%q: status %d, want %d (%v)", tc.args, status, tc.status, err)
		}
		for _, want := range tc.out {
			if n := strings.Count(out.String(), want); n != 1 {
				t.Errorf("%q: %q printed %d times in:\n%s", tc.args, want, n, out.String())
			}
		}
		for _, not := range tc.none {
			if strings.Contains(out.String(), not) {
				t.Errorf("%q: printed %q:\n%s", tc.args, not, out.String())
			}
		}
	}
	var out bytes.Buffer
	fs, n, d, s := newFlags(&out)
	if err := Parse(fs, []string{"-n", "7", "-timeout", "250ms", "-name", "z"}); err != nil || *n != 7 || *d != 250*time.Millisecond || *s != "z" {
		t.Fatalf("values %d %v %q, %v", *n, *d, *s, err)
	}
}

func TestExit(t *testing.T) {
	var out bytes.Buffer
	if s := Exit("cmd", &lambdaenv.NotInLambdaError{Hint: "run with -local"}, &out); s != 2 ||
		out.String() != "cmd: not running in AWS Lambda (AWS_LAMBDA_RUNTIME_API is unset): run with -local\n" {
		t.Fatalf("not in Lambda: %d %q", s, out.String())
	}
	out.Reset()
	if s := Exit("cmd", errors.New("DATABASE_URL is not set"), &out); s != 1 || out.String() != "cmd: DATABASE_URL is not set\n" {
		t.Fatalf("failure: %d %q", s, out.String())
	}
}
