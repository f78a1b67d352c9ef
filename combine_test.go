package ratekit_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

func TestCombine(t *testing.T) {
	burst := ratekit.Policy{Name: "burst", Quota: 10, Window: time.Second}
	daily := ratekit.Policy{Name: "daily", Quota: 1000, Window: 24 * time.Hour}
	org := ratekit.Policy{Name: "org", Quota: 5000, Window: time.Minute}
	part := func(p ratekit.Policy, allowed bool, remaining int64, retry, reset time.Duration) ratekit.Decision {
		return ratekit.Decision{Allowed: allowed, Quota: p.Quota, Remaining: remaining, RetryAfter: retry, ResetAfter: reset, Policy: p}
	}
	tests := []struct {
		name  string
		parts []ratekit.Decision
		want  int // index of the part whose Quota, Remaining, ResetAfter and Policy the sum carries
		allow bool
		retry time.Duration
	}{
		{"all admit: smallest remaining", []ratekit.Decision{
			part(burst, true, 9, 0, time.Second), part(daily, true, 998, 0, 20*time.Hour)}, 0, true, 0},
		{"all admit: tie on remaining, longest reset", []ratekit.Decision{
			part(burst, true, 3, 0, time.Second), part(daily, true, 3, 0, 20*time.Hour)}, 1, true, 0},
		{"one denies: its numbers even with more remaining", []ratekit.Decision{
			part(burst, true, 0, 0, time.Second), part(daily, false, 2, 3*time.Hour, 20*time.Hour)}, 1, false, 3 * time.Hour},
		{"two deny: longest retry, smallest remaining among them", []ratekit.Decision{
			part(burst, false, 0, 100*time.Millisecond, time.Second),
			part(daily, true, 0, 0, 20*time.Hour),
			part(org, false, 1, 30*time.Second, time.Minute)}, 0, false, 30 * time.Second},
		{"one part", []ratekit.Decision{part(daily, false, 0, time.Minute, time.Hour)}, 0, false, time.Minute},
	}
	for _, tc := range tests {
		d := ratekit.Combine(tc.parts)
		m := tc.parts[tc.want]
		if d.Allowed != tc.allow || d.RetryAfter != tc.retry || d.Quota != m.Quota || d.Remaining != m.Remaining ||
			d.ResetAfter != m.ResetAfter || d.Policy != m.Policy || !reflect.DeepEqual(d.Parts, tc.parts) {
			t.Errorf("%s: Combine = %+v", tc.name, d)
		}
	}
	if d := ratekit.Combine(nil); !reflect.DeepEqual(d, ratekit.Decision{}) {
		t.Errorf("ratekit.Combine(nil) = %+v, want the zero Decision", d)
	}
}
