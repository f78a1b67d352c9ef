package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/benchmarks/internal/harness"
)

// turnOnly, when not nil, keeps in the blocks table only the contenders
// whose name it matches, and the floor (the -contenders flag).
var turnOnly *regexp.Regexp

// runBlocks measures the Redis contenders the way an outside harness does:
// for each scenario and concurrency, rounds of one block per contender (a
// warm-up of warm, then d measured), contenders one after the other, the
// order reversed every other round; the table shows medians over the rounds.
// Around each measured block it resets Redis's INFO commandstats and reads
// them back, so that the table also gives the server time per decision.
func runBlocks(ctx context.Context, addr, prefix, rlfDir string, maxInFlight int, scenarios []scenario, concs []int, rounds int, d, warm time.Duration) error {
	t, err := openTurnEnv(addr, prefix+":block", rlfDir, maxInFlight)
	if err != nil {
		return err
	}
	defer t.close()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	contenders := slices.DeleteFunc(turnContenders(ctx, t), func(c turnContender) bool {
		return c.role != floor && turnOnly != nil && !turnOnly.MatchString(c.name)
	})
	type cell struct{ s, c, n int }
	results := map[cell][]harness.Result{}
	server := map[cell][]float64{}
	for si, s := range scenarios {
		for _, conc := range concs {
			runners, err := turnRunners(contenders, s, conc, "blocks")
			if err != nil {
				return err
			}
			rs, us, err := measureBlocks(ctx, contenders, runners, conc, rounds, d, warm, admin)
			if err != nil {
				return fmt.Errorf("blocks, %s, %v", s.short, err)
			}
			for ci := range contenders {
				results[cell{si, ci, conc}] = rs[ci]
				server[cell{si, ci, conc}] = us[ci]
			}
			fmt.Fprintf(os.Stderr, "blocks: %s at %d done\n", s.short, conc)
		}
	}
	fmt.Printf("### Redis in blocks: rounds of %v warm-up + %v measured per contender, one after the other, order reversed every other round; medians of %d rounds\n\n", warm, d, rounds)
	fmt.Println("Go contenders have clients of their own (go-redis: PoolSize = MinIdleConns = concurrency; rueidis: one client); ratekit's are")
	fmt.Println("configured as the README says (ServerlessOptions); every Go contender gives each decision a 1 s deadline. Redis µs/decision is the server's")
	fmt.Println("time in commands (INFO commandstats, reset before each block) over the block's decisions. × best peer: over the")
	fmt.Println("fastest of redis_rate, ulule and rate-limiter-flexible in the same cell; × INCR: over one go-redis INCR round trip.")
	fmt.Println()
	fmt.Println("| scenario | callers | contender | decisions/s | p50 | p99 | Redis µs/decision | × INCR | × best peer |")
	fmt.Println("|---|---:|---|---:|---:|---:|---:|---:|---:|")
	for si, s := range scenarios {
		for _, conc := range concs {
			floorTP, bestPeer := turnReferences(contenders, func(ci int) harness.Result { return harness.Median(results[cell{si, ci, conc}]) })
			for ci, c := range contenders {
				id := cell{si, ci, conc}
				m := harness.Median(results[id])
				fmt.Printf("| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", s.short, conc, c.name, count(m.Throughput),
					harness.Latency(m.P50), harness.Latency(m.P99), usecCell(server[id]), ratio(m.Throughput, floorTP), ratio(m.Throughput, bestPeer))
			}
		}
	}
	fmt.Println()
	return nil
}

// measureBlocks measures one cell as an outside harness does: rounds of
// one block per contender (runners[ci] runs contender ci at conc callers: a
// warm-up of warm, then d measured), contenders one after the other, the
// order reversed every other round. It returns each contender's results,
// one per round, and, when admin is not nil, the Redis time in commands per
// decision of each measured block (INFO commandstats, reset before the
// block).
func measureBlocks(ctx context.Context, contenders []turnContender, runners []harness.Runner, conc, rounds int, d, warm time.Duration, admin *redis.Client) ([][]harness.Result, [][]float64, error) {
	results := make([][]harness.Result, len(contenders))
	server := make([][]float64, len(contenders))
	order := make([]int, len(contenders))
	for i := range order {
		order[i] = i
	}
	for round := range rounds {
		if round > 0 {
			slices.Reverse(order)
		}
		for _, ci := range order {
			var discard harness.Sample
			if err := runners[ci](ctx, conc, warm, &discard); err != nil {
				return nil, nil, fmt.Errorf("%s, concurrency %d: %v", contenders[ci].name, conc, err)
			}
			if admin != nil {
				if err := admin.ConfigResetStat(ctx).Err(); err != nil {
					return nil, nil, err
				}
			}
			var sample harness.Sample
			if err := runners[ci](ctx, conc, d, &sample); err != nil {
				return nil, nil, fmt.Errorf("%s, concurrency %d: %v", contenders[ci].name, conc, err)
			}
			res := sample.Result()
			results[ci] = append(results[ci], res)
			if admin == nil || res.Decisions == 0 {
				continue
			}
			usec, err := commandUsec(ctx, admin)
			if err != nil {
				return nil, nil, err
			}
			server[ci] = append(server[ci], usec/float64(res.Decisions))
		}
	}
	return results, server, nil
}

// commandUsec returns the microseconds Redis spent in commands since the
// last CONFIG RESETSTAT, less the INFO that reads them.
func commandUsec(ctx context.Context, admin *redis.Client) (float64, error) {
	info, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" || name == "cmdstat_config" {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				u, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return 0, fmt.Errorf("commandstats %q: %v", line, err)
				}
				total += u
			}
		}
	}
	return total, nil
}

func usecCell(vs []float64) string {
	if len(vs) == 0 {
		return "–"
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	return strconv.FormatFloat(s[len(s)/2], 'f', 2, 64)
}
