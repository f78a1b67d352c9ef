package ratekit

import (
	"strconv"
	"time"
)

// PeriodUnit is the step of a [Period]: a day, a week or a month. The zero
// PeriodUnit is invalid, so that the choice is always written down.
type PeriodUnit int

const (
	// Day is a period of one calendar day: 24 hours of wall clock, 23 or 25
	// on the day of a daylight-saving change.
	Day PeriodUnit = iota + 1

	// Week is a period of seven calendar days.
	Week

	// Month is a period of one calendar month: 28 to 31 days.
	Month
)

// String returns the unit's name as written in Go, such as "Month", or
// "PeriodUnit(n)" for an unknown value.
func (u PeriodUnit) String() string {
	switch u {
	case Day:
		return "Day"
	case Week:
		return "Week"
	case Month:
		return "Month"
	}
	return "PeriodUnit(" + strconv.Itoa(int(u)) + ")"
}

// Period is a calendar period: the window of a quota sold per day, week or
// month ("100,000 a month, from each customer's billing day"), whose
// boundaries are wall-clock times in a time zone rather than multiples of a
// fixed duration since the Unix epoch. The zero Period means none: a policy
// without a Period counts in windows of its Window.
//
// Boundaries follow the wall clock of Location:
//
//   - Without an Anchor, periods are calendar periods: days start at
//     midnight, weeks on Monday at midnight, months on the 1st at midnight.
//   - With an Anchor, periods start at the Anchor's wall-clock time in
//     Location, stepped by Unit: a monthly anchor on the 14th at 09:00
//     resets on every 14th at 09:00, a weekly anchor on a Thursday at 18:30
//     every Thursday at 18:30. Boundary k is the Anchor plus k units,
//     computed from the Anchor and never from the previous boundary, so a
//     monthly anchor on the 29th to 31st resets on the last day of each
//     shorter month (February 28th, or 29th in a leap year) and on the
//     Anchor's day again in the months that have it (Go's AddDate would
//     normalise January 31st plus one month to March 3rd; Period does not).
//     Instants before the Anchor belong to the periods before it, by the
//     same rule.
//
// Daylight-saving changes are resolved by one deterministic rule: a
// boundary whose wall-clock time does not exist (it falls in a gap, when
// clocks jump forward) is the instant the gap ends, the first instant whose
// wall clock is at or after it; a boundary whose wall-clock time occurs
// twice (clocks fall back) is its first occurrence. So a day is 23 or 25
// hours long on the day of a change, and a period is never empty.
//
// A Period is a value; it is safe for concurrent use.
type Period struct {
	// Unit is the step between boundaries. Required in a non-zero Period.
	Unit PeriodUnit

	// Location is the time zone whose wall clock the boundaries follow.
	// Nil means UTC.
	Location *time.Location

	// Anchor is an instant at which a period starts. The zero Time means
	// calendar periods (see [Period]). Its wall-clock time is read in
	// Location.
	Anchor time.Time
}

// IsZero reports whether p is the zero Period, which means no period.
func (p Period) IsZero() bool {
	return p.Unit == 0 && p.Location == nil && p.Anchor.IsZero()
}

// Validate reports whether p is a valid non-zero Period: a known Unit. The
// error matches [ErrInvalidConfig].
func (p Period) Validate() error {
	if p.Unit < Day || p.Unit > Month {
		return configErr("period unit must be ratekit.Day, ratekit.Week or ratekit.Month, got %v", p.Unit)
	}
	return nil
}

// Bounds returns the period that contains t: start <= t < end. The length
// end − start varies with the calendar (a month is 28 to 31 days) and with
// daylight-saving changes (a day is 23 to 25 hours). Bounds of an invalid
// Period (see [Period.Validate]) are t and t + 24 hours.
func (p Period) Bounds(t time.Time) (start, end time.Time) {
	if p.Validate() != nil {
		return t, t.Add(24 * time.Hour)
	}
	loc := p.Location
	if loc == nil {
		loc = time.UTC
	}
	a := p.anchorWall(loc)
	tw := t.In(loc)
	// Estimate the index k of the period that contains t from the wall
	// clocks, then correct it: boundary(k) <= t < boundary(k+1). The
	// estimate is off by at most one in practice; the loops make any
	// estimate right.
	var k int64
	switch p.Unit {
	case Month:
		k = int64(tw.Year()-a.year)*12 + int64(tw.Month()-a.month)
	case Day:
		k = civilDay(tw.Year(), tw.Month(), tw.Day()) - civilDay(a.year, a.month, a.day)
	case Week:
		k = floorDiv(civilDay(tw.Year(), tw.Month(), tw.Day())-civilDay(a.year, a.month, a.day), 7)
	}
	start = p.boundary(a, loc, k)
	for t.Before(start) {
		k--
		start = p.boundary(a, loc, k)
	}
	end = p.boundary(a, loc, k+1)
	for !t.Before(end) {
		k++
		start, end = end, p.boundary(a, loc, k+1)
	}
	return start, end
}

// wall is a wall-clock time: a civil date and a time of day.
type wall struct {
	year              int
	month             time.Month
	day               int
	hour, min, sec, n int
}

// anchorWall returns the wall clock that periods of p start at: the
// Anchor's in loc, or for calendar periods midnight of a Monday that is
// also the 1st of a month (2001-01-01).
func (p Period) anchorWall(loc *time.Location) wall {
	if p.Anchor.IsZero() {
		return wall{year: 2001, month: time.January, day: 1}
	}
	a := p.Anchor.In(loc)
	return wall{a.Year(), a.Month(), a.Day(), a.Hour(), a.Minute(), a.Second(), a.Nanosecond()}
}

// boundary returns the start of period k: the anchor's wall clock moved
// by k units, resolved to an instant in loc.
func (p Period) boundary(a wall, loc *time.Location, k int64) time.Time {
	w := a
	switch p.Unit {
	case Day:
		w.year, w.month, w.day = civilDate(civilDay(a.year, a.month, a.day) + k)
	case Week:
		w.year, w.month, w.day = civilDate(civilDay(a.year, a.month, a.day) + 7*k)
	case Month:
		m := int64(a.year)*12 + int64(a.month-1) + k
		w.year, w.month = int(floorDiv(m, 12)), time.Month(m-floorDiv(m, 12)*12+1)
		w.day = min(a.day, daysIn(w.year, w.month))
	}
	return resolveWall(w, loc)
}

// resolveWall returns the instant whose wall clock in loc is w: its first
// occurrence when the wall clock occurs twice, and the end of the gap when
// it does not occur at all (see [Period]).
func resolveWall(w wall, loc *time.Location) time.Time {
	naive := time.Date(w.year, w.month, w.day, w.hour, w.min, w.sec, w.n, time.UTC).Unix()
	// The offsets in force a day either side cover every transition that
	// can affect this wall clock.
	_, before := time.Unix(naive-86400, 0).In(loc).Zone()
	_, after := time.Unix(naive+86400, 0).In(loc).Zone()
	found := false
	var best int64
	for _, off := range [2]int{before, after} {
		u := naive - int64(off)
		if _, o := time.Unix(u, 0).In(loc).Zone(); o == off && (!found || u < best) {
			best, found = u, true
		}
	}
	if found {
		return time.Unix(best, int64(w.n)).In(loc)
	}
	if before != after {
		// A gap: the wall clock is skipped. The zone in force at
		// naive - before (already past the transition) starts at the
		// instant the gap ends.
		start, _ := time.Unix(naive-int64(before), 0).In(loc).ZoneBounds()
		if !start.IsZero() {
			return start.In(loc)
		}
	}
	return time.Date(w.year, w.month, w.day, w.hour, w.min, w.sec, w.n, loc)
}

// civilDay returns the number of days from 1970-01-01 to the given date
// (negative before it).
func civilDay(y int, m time.Month, d int) int64 {
	return floorDiv(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix(), 86400)
}

// civilDate is the inverse of civilDay.
func civilDate(day int64) (int, time.Month, int) {
	return time.Unix(day*86400, 0).UTC().Date()
}

// daysIn returns the number of days of month m of year y.
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}
