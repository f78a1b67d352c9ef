package plans_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"
	_ "time/tzdata" // Europe/Berlin and America/New_York on any machine

	"github.com/ratekit/ratekit"
)

// zoneSpec describes a time zone that a worker process rebuilds exactly
// (a *time.Location does not cross a process boundary).
type zoneSpec struct {
	// Fixed is the offset in seconds of a zone without changes, when
	// Change is zero: a "time machine" that makes the wall clock of a
	// chosen past date read now (see timeMachine).
	Fixed int
	// Change, when not zero, is the Unix second at which a zone's offset
	// changes from Before to After seconds east of UTC: a daylight-saving
	// change placed seconds from now (see dstChange).
	Change        int64
	Before, After int
}

// location builds the zone z describes.
func (z zoneSpec) location() (*time.Location, error) {
	if z.Change == 0 {
		return time.FixedZone(fmt.Sprintf("machine%+d", z.Fixed), z.Fixed), nil
	}
	return time.LoadLocationFromTZData("dst-change", tzif(z.Change, z.Before, z.After))
}

// timeMachine returns the fixed zone whose wall clock reads wall (a UTC
// wall-clock reading) at the real instant at: with it, a Period of any
// past date has its boundary at `at` on the database's real clock. A fixed
// zone has one offset, so Period's wall-clock arithmetic in it is that of
// UTC, moved by the offset, whatever its size.
func timeMachine(wall, at time.Time) zoneSpec {
	return zoneSpec{Fixed: int(wall.Unix() - at.Unix())}
}

// dstChange returns a zone whose offset changes from before to after
// seconds at the instant at: Berlin's spring forward (+1 h to +2 h) or New
// York's fall back (−4 h to −5 h), on today's date. Period resolves wall
// clocks by looking at the offsets a day either side, so the zone must
// have real-sized offsets: a time machine cannot move a real zone's change.
func dstChange(at time.Time, before, after int) zoneSpec {
	return zoneSpec{Change: at.Unix(), Before: before, After: after}
}

// tzif encodes a version 1 TZif file (RFC 8536) of one change at unix from
// before to after seconds east of UTC; the later offset is daylight time
// when it is the larger.
func tzif(unix int64, before, after int) []byte {
	var b bytes.Buffer
	b.WriteString("TZif")
	b.Write(make([]byte, 16))                      // version 1, 15 unused bytes
	for _, n := range []uint32{0, 0, 0, 1, 2, 8} { // isut, isstd, leap, time, type, char counts
		binary.Write(&b, binary.BigEndian, n)
	}
	binary.Write(&b, binary.BigEndian, int32(unix))
	b.WriteByte(1) // the change is to type 1
	for i, off := range []int{before, after} {
		binary.Write(&b, binary.BigEndian, int32(off))
		dst := byte(0)
		if (i == 1) == (after > before) {
			dst = 1
		}
		b.WriteByte(dst)
		b.WriteByte(byte(4 * i)) // designation index
	}
	b.WriteString("STD\x00DST\x00")
	return b.Bytes()
}

// boundsCase is one row of TestPeriodBoundsTables: the period that
// contains at, in a real zone.
type boundsCase struct {
	name       string
	period     ratekit.Period
	at         time.Time
	start, end string // RFC 3339
	length     time.Duration
}

func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

var (
	berlin  = mustZone("Europe/Berlin")
	newYork = mustZone("America/New_York")
)

// boundsTable holds, in the real zones and dates, the cases that
// TestPlansAcrossProcesses runs live on the database clock (in a time
// machine for the month ends, in a zone with the same change on today's
// date for daylight saving), plus a few that it does not run live.
var boundsTable = []boundsCase{
	{"31st anchor, leap February", ratekit.Period{Unit: ratekit.Month, Anchor: time.Date(2024, 1, 31, 0, 0, 0, 0, time.UTC)},
		time.Date(2024, 2, 10, 0, 0, 0, 0, time.UTC), "2024-01-31T00:00:00Z", "2024-02-29T00:00:00Z", 29 * 24 * time.Hour},
	{"31st anchor, after a leap February", ratekit.Period{Unit: ratekit.Month, Anchor: time.Date(2024, 1, 31, 0, 0, 0, 0, time.UTC)},
		time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC), "2024-02-29T00:00:00Z", "2024-03-31T00:00:00Z", 31 * 24 * time.Hour},
	{"31st anchor, common February", ratekit.Period{Unit: ratekit.Month, Anchor: time.Date(2025, 1, 31, 9, 0, 0, 0, time.UTC)},
		time.Date(2025, 2, 27, 0, 0, 0, 0, time.UTC), "2025-01-31T09:00:00Z", "2025-02-28T09:00:00Z", 28 * 24 * time.Hour},
	{"31st anchor, after a common February", ratekit.Period{Unit: ratekit.Month, Anchor: time.Date(2025, 1, 31, 9, 0, 0, 0, time.UTC)},
		time.Date(2025, 2, 28, 9, 0, 0, 0, time.UTC), "2025-02-28T09:00:00Z", "2025-03-31T09:00:00Z", 31 * 24 * time.Hour},
	{"Berlin, day anchored in the spring-forward gap", ratekit.Period{Unit: ratekit.Day, Location: berlin, Anchor: time.Date(2026, 3, 1, 2, 30, 0, 0, berlin)},
		time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC), "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", 23*time.Hour + 30*time.Minute},
	{"Berlin, day after the gap", ratekit.Period{Unit: ratekit.Day, Location: berlin, Anchor: time.Date(2026, 3, 1, 2, 30, 0, 0, berlin)},
		time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC), "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00", 23*time.Hour + 30*time.Minute},
	{"New York, day before the fall-back", ratekit.Period{Unit: ratekit.Day, Location: newYork, Anchor: time.Date(2026, 10, 1, 1, 30, 0, 0, newYork)},
		time.Date(2026, 11, 1, 5, 0, 0, 0, time.UTC), "2026-10-31T01:30:00-04:00", "2026-11-01T01:30:00-04:00", 24 * time.Hour},
	{"New York, day anchored in the repeated hour", ratekit.Period{Unit: ratekit.Day, Location: newYork, Anchor: time.Date(2026, 10, 1, 1, 30, 0, 0, newYork)},
		time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC), "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00", 25 * time.Hour},
	// Not run live: calendar days of the changes, and a calendar month.
	{"Berlin, calendar day of the spring forward", ratekit.Period{Unit: ratekit.Day, Location: berlin},
		time.Date(2026, 3, 29, 12, 0, 0, 0, berlin), "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", 23 * time.Hour},
	{"New York, calendar day of the fall back", ratekit.Period{Unit: ratekit.Day, Location: newYork},
		time.Date(2026, 11, 1, 12, 0, 0, 0, newYork), "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00", 25 * time.Hour},
	{"calendar February, leap year", ratekit.Period{Unit: ratekit.Month},
		time.Date(2028, 2, 29, 23, 0, 0, 0, time.UTC), "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", 29 * 24 * time.Hour},
}

// TestPeriodBoundsTables pins the bounds of the real zones and dates whose
// shapes TestPlansAcrossProcesses runs live, and checks that the zones it
// runs them in reproduce them: a time machine gives the same month
// boundaries as UTC on the real date, and a zone with Berlin's (or New
// York's) change on another date gives days of the same lengths.
func TestPeriodBoundsTables(t *testing.T) {
	for _, tc := range boundsTable {
		start, end := tc.period.Bounds(tc.at)
		if start.Format(time.RFC3339) != tc.start || end.Format(time.RFC3339) != tc.end || end.Sub(start) != tc.length {
			t.Errorf("%s: Bounds(%v) = %v to %v (%v), want %s to %s (%v)", tc.name, tc.at, start, end, end.Sub(start), tc.start, tc.end, tc.length)
		}
	}
	now := time.Now().Truncate(time.Second)
	for _, sc := range scenarios {
		boundary := now.Add(time.Hour)
		p, err := sc.period(boundary)
		if err != nil {
			t.Fatal(err)
		}
		s0, e0 := p.Bounds(boundary.Add(-time.Second))
		s1, e1 := p.Bounds(boundary)
		if !e0.Equal(boundary) || !s1.Equal(boundary) || e0.Sub(s0) != sc.before || e1.Sub(s1) != sc.after {
			t.Errorf("%s: periods %v to %v and %v to %v around %v, want %v and %v long", sc.name, s0, e0, s1, e1, boundary, sc.before, sc.after)
		}
		for i, name := range sc.real {
			want := []time.Duration{sc.before, sc.after}[i]
			found := false
			for _, tc := range boundsTable {
				if tc.name == name {
					found = tc.length == want
				}
			}
			if !found {
				t.Errorf("%s: no row %q of %v in the table", sc.name, name, want)
			}
		}
	}
}
