// Package cli holds what the examples' commands share on their command
// line: parsing that reports each mistake once, flags that refuse values
// out of range, and exit statuses (0 for -h, 2 for a usage mistake or a
// Lambda binary started outside Lambda, 1 for other failures).
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/ratekit/ratekit/examples/internal/lambdaenv"
)

// UsageError is a mistake on the command line. When Reported is true the
// flag package has printed it already, with the usage.
type UsageError struct {
	Err      error
	Reported bool
}

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// SetUsage makes fs print synopsis, its flags and then more (which may be
// empty) as its usage, on fs.Output().
func SetUsage(fs *flag.FlagSet, synopsis, more string) {
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
		if more != "" {
			fmt.Fprintf(w, "\n%s", more)
		}
	}
}

// Parse parses args with fs, which must have been made with
// flag.ContinueOnError. For -h or -help the flag package prints the usage
// and Parse returns flag.ErrHelp. For an unknown flag or a bad value it
// prints the error once, then the usage, and Parse returns a *UsageError
// marked Reported. Arguments after the flags are refused with a
// *UsageError that is not reported yet.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &UsageError{Err: err, Reported: true}
	}
	if fs.NArg() > 0 {
		return &UsageError{Err: fmt.Errorf("unexpected argument %q (this command takes flags only; run it with -h for usage)", fs.Arg(0))}
	}
	return nil
}

// Exit returns the exit status for the error a command's run returned, and
// prints the error to stderr, prefixed with prog, unless it was printed
// already: 0 for nil and flag.ErrHelp, 2 for a *UsageError and a
// *lambdaenv.NotInLambdaError, 1 for any other error.
func Exit(prog string, err error, stderr io.Writer) int {
	var usage *UsageError
	var notInLambda *lambdaenv.NotInLambdaError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &usage):
		if !usage.Reported {
			fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		}
		return 2
	case errors.As(err, &notInLambda):
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return lambdaenv.ExitCode
	}
	fmt.Fprintf(stderr, "%s: %v\n", prog, err)
	return 1
}

// Int64 defines an int64 flag that accepts whole numbers from least to
// most; any other value is refused when the flags are parsed, with an
// error naming the flag.
func Int64(fs *flag.FlagSet, name string, value, least, most int64, usage string) *int64 {
	v := &int64Value{v: value, least: least, most: most}
	fs.Var(v, name, usage)
	return &v.v
}

type int64Value struct{ v, least, most int64 }

func (v *int64Value) String() string { return strconv.FormatInt(v.v, 10) }

func (v *int64Value) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("not a whole number")
	}
	if n < v.least || n > v.most {
		return fmt.Errorf("must be from %d to %d", v.least, v.most)
	}
	v.v = n
	return nil
}

// Duration defines a time.Duration flag that accepts durations from least
// to most (such as 300ms or 2s).
func Duration(fs *flag.FlagSet, name string, value, least, most time.Duration, usage string) *time.Duration {
	v := &durationValue{v: value, least: least, most: most}
	fs.Var(v, name, usage)
	return &v.v
}

type durationValue struct{ v, least, most time.Duration }

func (v *durationValue) String() string { return v.v.String() }

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("not a duration (such as 300ms or 2s)")
	}
	if d < v.least || d > v.most {
		return fmt.Errorf("must be from %v to %v", v.least, v.most)
	}
	v.v = d
	return nil
}

// String defines a string flag whose values check accepts.
func String(fs *flag.FlagSet, name, value, usage string, check func(string) error) *string {
	v := &stringValue{v: value, check: check}
	fs.Var(v, name, usage)
	return &v.v
}

type stringValue struct {
	v     string
	check func(string) error
}

func (v *stringValue) String() string { return v.v }

func (v *stringValue) Set(s string) error {
	if err := v.check(s); err != nil {
		return err
	}
	v.v = s
	return nil
}
