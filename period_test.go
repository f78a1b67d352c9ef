package ratekit_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

func mustLoad(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Skipf("time zone %s: %v", name, err)
	}
	return loc
}

func utc(y int, m time.Month, d, h, min int) time.Time {
	return time.Date(y, m, d, h, min, 0, 0, time.UTC)
}

// TestPeriodBoundsMonthAnchor31 holds a monthly anchor on the 31st at 09:00
// UTC through every month of a common and a leap year: the last day of each
// shorter month, the 31st again after it.
func TestPeriodBoundsMonthAnchor31(t *testing.T) {
	for _, year := range []int{2027, 2028, 2100, 2400} {
		p := ratekit.Period{Unit: ratekit.Month, Anchor: utc(2020, time.January, 31, 9, 0)}
		leap := year%4 == 0 && (year%100 != 0 || year%400 == 0)
		for m := time.January; m <= time.December; m++ {
			last := time.Date(year, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
			want := utc(year, m, last, 9, 0)
			if m == time.February && last != map[bool]int{true: 29, false: 28}[leap] {
				t.Fatalf("%d: February has %d days", year, last)
			}
			start, _ := p.Bounds(want.Add(time.Hour))
			if !start.Equal(want) {
				t.Errorf("%d-%02d: start %v, want %v", year, m, start, want)
			}
			// The period before the boundary ends exactly there.
			_, end := p.Bounds(want.Add(-time.Nanosecond))
			if !end.Equal(want) {
				t.Errorf("%d-%02d: end before %v, want %v", year, m, end, want)
			}
		}
	}
}

func TestPeriodBoundsTable(t *testing.T) {
	berlin := mustLoad(t, "Europe/Berlin")
	ny := mustLoad(t, "America/New_York")
	cases := []struct {
		name       string
		p          ratekit.Period
		at         time.Time
		start, end time.Time
	}{
		{"calendar month UTC", ratekit.Period{Unit: ratekit.Month}, utc(2028, time.February, 15, 12, 0),
			utc(2028, time.February, 1, 0, 0), utc(2028, time.March, 1, 0, 0)},
		{"calendar month end instant", ratekit.Period{Unit: ratekit.Month}, utc(2027, time.March, 1, 0, 0),
			utc(2027, time.March, 1, 0, 0), utc(2027, time.April, 1, 0, 0)},
		{"anchor 14th 09:00", ratekit.Period{Unit: ratekit.Month, Anchor: utc(2025, time.June, 14, 9, 0)}, utc(2027, time.January, 14, 8, 59),
			utc(2026, time.December, 14, 9, 0), utc(2027, time.January, 14, 9, 0)},
		{"anchor 14th at the boundary", ratekit.Period{Unit: ratekit.Month, Anchor: utc(2025, time.June, 14, 9, 0)}, utc(2027, time.January, 14, 9, 0),
			utc(2027, time.January, 14, 9, 0), utc(2027, time.February, 14, 9, 0)},
		{"before the anchor", ratekit.Period{Unit: ratekit.Month, Anchor: utc(2030, time.March, 31, 0, 0)}, utc(2029, time.March, 1, 0, 0),
			utc(2029, time.February, 28, 0, 0), utc(2029, time.March, 31, 0, 0)},
		{"anchor 29th in a common February", ratekit.Period{Unit: ratekit.Month, Anchor: utc(2024, time.January, 29, 0, 0)}, utc(2027, time.March, 10, 0, 0),
			utc(2027, time.February, 28, 0, 0), utc(2027, time.March, 29, 0, 0)},
		{"anchor 29th in a leap February", ratekit.Period{Unit: ratekit.Month, Anchor: utc(2024, time.January, 29, 0, 0)}, utc(2028, time.February, 29, 1, 0),
			utc(2028, time.February, 29, 0, 0), utc(2028, time.March, 29, 0, 0)},
		{"2100 is common", ratekit.Period{Unit: ratekit.Month, Anchor: utc(2024, time.January, 30, 0, 0)}, utc(2100, time.March, 1, 0, 0),
			utc(2100, time.February, 28, 0, 0), utc(2100, time.March, 30, 0, 0)},
		{"2400 is leap", ratekit.Period{Unit: ratekit.Month, Anchor: utc(2024, time.January, 30, 0, 0)}, utc(2400, time.March, 1, 0, 0),
			utc(2400, time.February, 29, 0, 0), utc(2400, time.March, 30, 0, 0)},
		{"calendar day UTC", ratekit.Period{Unit: ratekit.Day}, utc(2027, time.May, 5, 23, 59),
			utc(2027, time.May, 5, 0, 0), utc(2027, time.May, 6, 0, 0)},
		{"anchored day", ratekit.Period{Unit: ratekit.Day, Anchor: utc(2020, time.January, 1, 6, 30)}, utc(2027, time.May, 5, 6, 29),
			utc(2027, time.May, 4, 6, 30), utc(2027, time.May, 5, 6, 30)},
		{"calendar week: Monday", ratekit.Period{Unit: ratekit.Week}, utc(2027, time.January, 3, 23, 0), // a Sunday
			utc(2026, time.December, 28, 0, 0), utc(2027, time.January, 4, 0, 0)},
		{"calendar week across a leap day", ratekit.Period{Unit: ratekit.Week}, utc(2028, time.February, 29, 0, 0), // a Tuesday
			utc(2028, time.February, 28, 0, 0), utc(2028, time.March, 6, 0, 0)},
		{"anchored week: Thursday 18:30", ratekit.Period{Unit: ratekit.Week, Anchor: utc(2027, time.January, 7, 18, 30)}, utc(2026, time.December, 31, 18, 29),
			utc(2026, time.December, 24, 18, 30), utc(2026, time.December, 31, 18, 30)},
		// Berlin springs forward on 2027-03-28 (02:00 CET → 03:00 CEST) and
		// falls back on 2027-10-31 (03:00 CEST → 02:00 CET).
		{"Berlin: the day clocks spring forward is 23 h", ratekit.Period{Unit: ratekit.Day, Location: berlin}, time.Date(2027, time.March, 28, 12, 0, 0, 0, berlin),
			time.Date(2027, time.March, 28, 0, 0, 0, 0, berlin), time.Date(2027, time.March, 29, 0, 0, 0, 0, berlin)},
		{"Berlin: the day clocks fall back is 25 h", ratekit.Period{Unit: ratekit.Day, Location: berlin}, time.Date(2027, time.October, 31, 12, 0, 0, 0, berlin),
			time.Date(2027, time.October, 31, 0, 0, 0, 0, berlin), time.Date(2027, time.November, 1, 0, 0, 0, 0, berlin)},
		{"Berlin: March is an hour short", ratekit.Period{Unit: ratekit.Month, Location: berlin}, time.Date(2027, time.March, 28, 2, 30, 0, 0, time.UTC),
			time.Date(2027, time.March, 1, 0, 0, 0, 0, berlin), time.Date(2027, time.April, 1, 0, 0, 0, 0, berlin)},
		{"Berlin: an anchor at 02:30 on a skipped day starts at 03:00 CEST", ratekit.Period{Unit: ratekit.Day, Location: berlin, Anchor: time.Date(2027, time.January, 5, 2, 30, 0, 0, berlin)}, time.Date(2027, time.March, 28, 1, 30, 0, 0, time.UTC),
			time.Date(2027, time.March, 28, 1, 0, 0, 0, time.UTC), time.Date(2027, time.March, 29, 0, 30, 0, 0, time.UTC)},
		{"Berlin: an anchor at 02:30 on a repeated day starts at its first occurrence", ratekit.Period{Unit: ratekit.Day, Location: berlin, Anchor: time.Date(2027, time.January, 5, 2, 30, 0, 0, berlin)}, time.Date(2027, time.October, 31, 1, 15, 0, 0, time.UTC),
			time.Date(2027, time.October, 31, 0, 30, 0, 0, time.UTC), time.Date(2027, time.November, 1, 1, 30, 0, 0, time.UTC)},
		// New York springs forward on 2027-03-14 and falls back on 2027-11-07.
		{"New York: spring-forward day", ratekit.Period{Unit: ratekit.Day, Location: ny}, time.Date(2027, time.March, 14, 4, 0, 0, 0, ny),
			time.Date(2027, time.March, 14, 5, 0, 0, 0, time.UTC), time.Date(2027, time.March, 15, 4, 0, 0, 0, time.UTC)},
		{"New York: fall-back day", ratekit.Period{Unit: ratekit.Day, Location: ny}, time.Date(2027, time.November, 7, 12, 0, 0, 0, ny),
			time.Date(2027, time.November, 7, 4, 0, 0, 0, time.UTC), time.Date(2027, time.November, 8, 5, 0, 0, 0, time.UTC)},
		{"New York: a month anchored on the 31st at 01:30 across the fall-back", ratekit.Period{Unit: ratekit.Month, Location: ny, Anchor: time.Date(2027, time.January, 31, 1, 30, 0, 0, ny)}, time.Date(2027, time.November, 15, 0, 0, 0, 0, ny),
			time.Date(2027, time.October, 31, 1, 30, 0, 0, ny), time.Date(2027, time.November, 30, 1, 30, 0, 0, ny)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start, end := c.p.Bounds(c.at)
			if !start.Equal(c.start) || !end.Equal(c.end) {
				t.Errorf("Bounds(%v) = [%v, %v), want [%v, %v)", c.at, start, end, c.start.UTC(), c.end.UTC())
			}
		})
	}
	// The lengths the DST cases imply.
	if s, e := (ratekit.Period{Unit: ratekit.Day, Location: berlin}).Bounds(time.Date(2027, time.March, 28, 12, 0, 0, 0, berlin)); e.Sub(s) != 23*time.Hour {
		t.Errorf("Berlin spring-forward day lasts %v", e.Sub(s))
	}
	if s, e := (ratekit.Period{Unit: ratekit.Day, Location: ny}).Bounds(time.Date(2027, time.November, 7, 12, 0, 0, 0, ny)); e.Sub(s) != 25*time.Hour {
		t.Errorf("New York fall-back day lasts %v", e.Sub(s))
	}
}

func TestPeriodValidate(t *testing.T) {
	for _, p := range []ratekit.Period{{}, {Unit: 4}, {Unit: -1}, {Location: time.UTC}} {
		if err := p.Validate(); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", p, err)
		}
	}
	if err := (ratekit.Period{Unit: ratekit.Week}).Validate(); err != nil {
		t.Error(err)
	}
	bad := []ratekit.Policy{
		{Name: "m", Quota: 5, Algorithm: ratekit.FixedWindow, Window: time.Hour, Period: ratekit.Period{Unit: ratekit.Month}},
		{Name: "m", Quota: 5, Algorithm: ratekit.TokenBucket, Period: ratekit.Period{Unit: ratekit.Month}},
		{Name: "m", Quota: 5, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Anchor: utc(2027, 1, 1, 0, 0)}},
		{Name: "m", Quota: 5, Algorithm: ratekit.FixedWindow},
	}
	for _, p := range bad {
		if err := p.ValidatePeriod(); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", p, err)
		}
	}
}

func TestPlanValidate(t *testing.T) {
	month := ratekit.Policy{Name: "monthly", Quota: 100, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month}}
	burst := ratekit.Policy{Name: "burst", Quota: 10, Window: time.Second, Algorithm: ratekit.TokenBucket}
	if err := (ratekit.Plan{Name: "pro", Policies: []ratekit.Policy{burst, month}}).Validate(); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]ratekit.Plan{
		"empty":     {Name: "none"},
		"duplicate": {Policies: []ratekit.Policy{month, month}},
		"bad name":  {Policies: []ratekit.Policy{{Name: "a b", Quota: 1, Window: time.Second, Algorithm: ratekit.FixedWindow}}},
		"quota":     {Policies: []ratekit.Policy{{Name: "a", Quota: 0, Window: time.Second, Algorithm: ratekit.FixedWindow}}},
		"algorithm": {Policies: []ratekit.Policy{{Name: "a", Quota: 1, Window: time.Second}}},
		"too many":  {Policies: make([]ratekit.Policy, ratekit.MaxPlanPolicies+1)},
	} {
		if err := p.Validate(); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

func FuzzPeriodBounds(f *testing.F) {
	f.Add(int64(1_800_000_000), uint8(3), uint8(1), int64(1_700_000_000), int64(0))
	f.Add(int64(1_806_000_000), uint8(1), uint8(2), int64(0), int64(0))
	f.Add(int64(-5_000_000_000), uint8(2), uint8(3), int64(1_000_000_000), int64(123456789))
	f.Add(int64(1_838_077_200), uint8(3), uint8(1), int64(1_611_999_000), int64(0)) // Berlin fall-back
	zones := []*time.Location{time.UTC, mustLoad(f, "Europe/Berlin"), mustLoad(f, "America/New_York"), mustLoad(f, "Australia/Lord_Howe")}
	f.Fuzz(func(t *testing.T, sec int64, unit, zone uint8, anchor, nsec int64) {
		// Years 1700 to 2400.
		const lo, hi = -8_520_000_000, 13_500_000_000
		if sec < lo || sec > hi || anchor < lo || anchor > hi {
			t.Skip()
		}
		p := ratekit.Period{Unit: ratekit.PeriodUnit(unit%3 + 1), Location: zones[int(zone)%len(zones)]}
		if anchor != 0 {
			p.Anchor = time.Unix(anchor, nsec%1e9)
		}
		at := time.Unix(sec, nsec%1e9)
		start, end := p.Bounds(at)
		if at.Before(start) || !at.Before(end) {
			t.Fatalf("%+v: Bounds(%v) = [%v, %v) does not contain it", p, at, start, end)
		}
		if s, e := p.Bounds(start); !s.Equal(start) || !e.Equal(end) {
			t.Fatalf("%+v: Bounds(start %v) = [%v, %v), want [%v, %v)", p, start, s, e, start, end)
		}
		if s, _ := p.Bounds(end); !s.Equal(end) {
			t.Fatalf("%+v: Bounds(end %v) starts at %v", p, end, s)
		}
		minLen := map[ratekit.PeriodUnit]time.Duration{ratekit.Day: 22*time.Hour + 30*time.Minute, ratekit.Week: 7*24*time.Hour - 2*time.Hour, ratekit.Month: 28*24*time.Hour - 2*time.Hour}[p.Unit]
		if p.Location != zones[3] {
			minLen = map[ratekit.PeriodUnit]time.Duration{ratekit.Day: 23 * time.Hour, ratekit.Week: 7*24*time.Hour - time.Hour, ratekit.Month: 28*24*time.Hour - time.Hour}[p.Unit]
		}
		if end.Sub(start) < minLen {
			t.Fatalf("%+v: period [%v, %v) lasts %v", p, start, end, end.Sub(start))
		}
	})
}
