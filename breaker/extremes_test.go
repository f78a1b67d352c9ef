package breaker_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratekit/breaker"
	"github.com/ratekit/ratekit/internal/extremes"
)

// TestNewExtremes feeds every numeric field of Config extreme values: New
// returns a limiter or an error matching ratekit.ErrInvalidConfig, never
// panics, and a limiter it returns trips and answers.
func TestNewExtremes(t *testing.T) {
	fields := map[string]func(*breaker.Config, int64){
		"Failures": func(c *breaker.Config, v int64) { c.Failures = int(v) },
		"Probes":   func(c *breaker.Config, v int64) { c.Probes = int(v) },
		"OpenFor":  func(c *breaker.Config, v int64) { c.OpenFor = time.Duration(v) },
	}
	values := append([]int64{}, extremes.Ints...)
	for _, d := range extremes.Durations {
		values = append(values, int64(d))
	}
	for field, set := range fields {
		for _, v := range values {
			cfg := breaker.Config{Failures: 1}
			set(&cfg, v)
			s := &switchable{}
			var l *breaker.Limiter
			if !extremes.Check(t, extremes.Name(field, v), func() (err error) {
				l, err = breaker.New(s, cfg)
				return err
			}) {
				continue
			}
			for range 3 {
				_, _ = l.Allow(context.Background(), req())
			}
			s.up.Store(true)
			_, _ = l.Allow(context.Background(), req())
		}
	}
}
