// Command initbench measures how long a Lambda function binary takes to
// start: it plays the Lambda Runtime API on a loopback port, starts the
// binary as the provided.al2023 runtime would (AWS_LAMBDA_RUNTIME_API set),
// and records the time from exec until the binary asks for its first
// invocation (ready: the init phase is over) and until it has posted the
// response to that invocation. Binaries are run in turn, n times each, and
// medians are printed.
//
//	go -C examples run ./lambda/initbench -n 40 "$PWD/bootstrap" "$PWD/baseline"
package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

//go:embed event.json
var event []byte

func main() {
	n := flag.Int("n", 30, "runs per binary")
	flag.Parse()
	bins := flag.Args()
	if len(bins) == 0 {
		fmt.Fprintln(os.Stderr, "usage: initbench [-n runs] binary...")
		os.Exit(2)
	}
	ready := make([][]time.Duration, len(bins))
	first := make([][]time.Duration, len(bins))
	for i := 0; i < *n; i++ {
		for b, bin := range bins {
			r, f, err := run(bin)
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", bin, err)
				os.Exit(1)
			}
			ready[b] = append(ready[b], r)
			first[b] = append(first[b], f)
		}
	}
	fmt.Printf("%-40s %12s %12s %12s\n", "binary ("+strconv.Itoa(*n)+" runs)", "ready p50", "ready min", "1st resp p50")
	for b, bin := range bins {
		fmt.Printf("%-40s %12v %12v %12v\n", bin, median(ready[b]), slices.Min(ready[b]), median(first[b]))
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2].Round(10 * time.Microsecond)
}

// run starts bin once against a fake Runtime API and returns the time to
// its first /next request and to its first response.
func run(bin string) (ready, first time.Duration, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var start time.Time
	readyc := make(chan time.Duration, 1)
	firstc := make(chan time.Duration, 1)
	var nexts atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET /2018-06-01/runtime/invocation/next", func(w http.ResponseWriter, r *http.Request) {
		if nexts.Add(1) > 1 {
			<-r.Context().Done() // the instance waits for work until it is stopped
			return
		}
		readyc <- time.Since(start)
		w.Header().Set("Lambda-Runtime-Aws-Request-Id", "8f14e45f-ceea-467f-a8d1-2a9f0e0b3c1d")
		w.Header().Set("Lambda-Runtime-Deadline-Ms", strconv.FormatInt(time.Now().Add(3*time.Second).UnixMilli(), 10))
		w.Header().Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:eu-west-1:123456789012:function:hello")
		w.Header().Set("Lambda-Runtime-Trace-Id", "Root=1-6741c5a2-3c1b5f0e2d9a7b6c5e4f3a21")
		w.Write(event)
	})
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/response", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"statusCode":200`) {
			fmt.Fprintf(os.Stderr, "unexpected response: %s\n", body)
		}
		w.WriteHeader(http.StatusAccepted)
		firstc <- time.Since(start)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(os.Stderr, "unexpected call %s %s\n", r.Method, r.URL)
		w.WriteHeader(http.StatusInternalServerError)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	defer srv.Close()

	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(),
		"AWS_LAMBDA_RUNTIME_API="+ln.Addr().String(),
		"AWS_LAMBDA_FUNCTION_NAME=hello",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=128",
		"RATEKIT_SECRET=0123456789abcdef0123456789abcdef-initbench",
	)
	cmd.Stderr = os.Stderr
	start = time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	select {
	case ready = <-readyc:
	case <-ctx.Done():
		return 0, 0, fmt.Errorf("no /next request within 10 s")
	}
	select {
	case first = <-firstc:
	case <-ctx.Done():
		return 0, 0, fmt.Errorf("no response within 10 s")
	}
	return ready, first, nil
}
