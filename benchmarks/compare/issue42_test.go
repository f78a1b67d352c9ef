package main

import (
	"math"
	"testing"
)

// TestLeadCell: the ratio is the fastest ratekit contender over the fastest
// peer, floors and references aside; below the row's bound (1 unless
// given) it is bold, and a cell without a peer or without a measurement
// has none.
func TestLeadCell(t *testing.T) {
	cs := []turnContender{{name: "a", role: ours}, {name: "b", role: ours}, {name: "p", role: peer}, {name: "q", role: peer},
		{name: "floor", role: floor}, {name: "ref", role: reference}}
	for _, tc := range []struct {
		name  string
		bound float64
		tp    []float64
		want  string
	}{
		{"ahead", 0, []float64{100, 300, 200, 150, 900, 900}, "1.50"},
		{"behind", 0, []float64{100, 150, 200, 190, 900, 900}, "**0.75**"},
		{"level", 0, []float64{200, 150, 200, 190, 1, 1}, "1.00"},
		{"no peer measured", 0, []float64{100, 150, 0, 0, 900, 900}, "—"},
		{"no ratekit measured", 0, []float64{0, 0, 200, 190, 900, 900}, "—"},
		{"not a number", 0, []float64{math.NaN(), 0, 200, 190, 900, 900}, "—"},
		{"above a plan's bound", planBound, []float64{100, 170, 200, 190, 900, 900}, "0.85"},
		{"below a plan's bound", planBound, []float64{100, 160, 200, 190, 900, 900}, "**0.80**"},
	} {
		if got := leadCell(cs, tc.bound, func(ci int) float64 { return tc.tp[ci] }); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestTenKeysUniform: the 10,000-key cell draws every key, each about as
// often as the others, whatever the worker.
func TestTenKeysUniform(t *testing.T) {
	_, tenK, _ := issue42Scenarios()
	n := len(tenK.keys)
	const workers, each = 64, 10_000
	counts := make([]int, n)
	for w := range workers {
		for i := range each {
			k := tenK.pick(w, i)
			if k < 0 || k >= n {
				t.Fatalf("worker %d, decision %d: key %d of %d", w, i, k, n)
			}
			counts[k]++
		}
	}
	// 64 draws per key on average. A chi-squared over 9,999 degrees of
	// freedom has mean 9,999 and standard deviation 141: 10,600 is more
	// than 4 of them above (the draws are deterministic, so is the test).
	mean := float64(workers*each) / float64(n)
	var chi2 float64
	for k, c := range counts {
		if c == 0 {
			t.Fatalf("key %d never drawn", k)
		}
		chi2 += (float64(c) - mean) * (float64(c) - mean) / mean
	}
	if chi2 > 10_600 {
		t.Errorf("chi-squared %.0f over %d keys: not uniform", chi2, n)
	}
	if !tenK.uniform {
		t.Error("the 10,000-key cell does not tell rate-limiter-flexible to draw uniformly")
	}
}
