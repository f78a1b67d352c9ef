package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// refusals compares, on one refused key, Redis's whole CPU time (INFO cpu:
// commands, parsing, system calls) per decision of the update script's read-
// first take against the stores' MULTI/EXEC of PTTL and GET, at each number
// of concurrent callers on one pipelined rueidis connection, n decisions per
// pass, and prints medians of passes.
func refusals(ctx context.Context, addr, prefix string, n, passes int, callers []int) error {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, PipelineMultiplex: -1})
	if err != nil {
		return err
	}
	defer c.Close()
	key := prefix + "{refused}"
	defer c.Do(ctx, c.B().Del().Key(key).Build())
	// A bucket of 10^8 units refilling 5 a millisecond, emptied: a take
	// of 10^7 is refused for over half an hour.
	const max, rate, take = "100000000", "5", "10000000"
	if err := c.Do(ctx, c.B().Eval().Script(updateLua).Numkeys(1).Key(key).Arg(max, rate, max, "T").Build()).Error(); err != nil {
		return err
	}
	sha := c.Do(ctx, c.B().ScriptLoad().Script(updateLua).Build())
	shaHex, err := sha.ToString()
	if err != nil {
		return err
	}
	ways := []struct {
		name string
		do   func() error
	}{
		{"update script, t", func() error {
			v, err := c.Do(ctx, c.B().Evalsha().Sha1(shaHex).Numkeys(1).Key(key).Arg(max, rate, take, "t").Build()).AsInt64()
			if err == nil && v >= 0 {
				err = fmt.Errorf("take admitted")
			}
			return err
		}},
		{"MULTI, PTTL, GET, EXEC", func() error {
			res := c.DoMulti(ctx, c.B().Multi().Build(), c.B().Pttl().Key(key).Build(), c.B().Get().Key(key).Build(), c.B().Exec().Build())
			_, err := res[3].ToArray()
			return err
		}},
	}
	fmt.Println("| callers | decision | Redis CPU µs/decision | decisions/s |")
	fmt.Println("|---:|---|---:|---:|")
	for _, conc := range callers {
		cpus, rates := make([][]float64, len(ways)), make([][]float64, len(ways))
		for p := range passes {
			for k := range ways {
				i := k
				if p%2 == 1 {
					i = len(ways) - 1 - k
				}
				c0, err := redisCPU(ctx, c)
				if err != nil {
					return err
				}
				start := time.Now()
				var wg sync.WaitGroup
				errs := make(chan error, conc)
				for range conc {
					wg.Go(func() {
						for range n / conc {
							if err := ways[i].do(); err != nil {
								errs <- err
								return
							}
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				close(errs)
				if err := <-errs; err != nil {
					return fmt.Errorf("%s: %w", ways[i].name, err)
				}
				c1, err := redisCPU(ctx, c)
				if err != nil {
					return err
				}
				done := float64(n / conc * conc)
				cpus[i] = append(cpus[i], (c1-c0)*1e6/done)
				rates[i] = append(rates[i], done/elapsed.Seconds())
			}
		}
		for i, w := range ways {
			fmt.Printf("| %d | %s | %.2f | %.0f |\n", conc, w.name, median(cpus[i]), median(rates[i]))
		}
	}
	return nil
}

// redisCPU returns the server's used_cpu_sys plus used_cpu_user, in
// seconds.
func redisCPU(ctx context.Context, c rueidis.Client) (float64, error) {
	info, err := c.Do(ctx, c.B().Info().Section("cpu").Build()).ToString()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		name, v, ok := strings.Cut(line, ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO cpu: %s: %w", line, err)
			}
			total += f
		}
	}
	return total, nil
}
