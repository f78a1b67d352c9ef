package redisscript

import (
	"testing"

	"github.com/ratekit/ratekit/kvstore"
)

// FuzzParseRecord checks that ParseRecord never panics, that it accepts only
// what FormatRecord writes, and that every record
// round-trips exactly.
func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{"0 0", "12 1795327323488854", "-1 -1", "9007199254740992 1", "", " ", "1", "1 ", " 1", "1 2 3", "+1 2", "01 2", "1 -0", "a b", "99999999999999999999 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		rec, ok := ParseRecord(s)
		if !ok {
			return
		}
		if f := FormatRecord(rec); f != s {
			t.Fatalf("%q parsed as %+v, which FormatRecord writes %q", s, rec, f)
		}
		again, ok := ParseRecord(FormatRecord(rec))
		if !ok || again != rec {
			t.Fatalf("%q parsed as %+v, which round-trips to %+v, %v", s, rec, again, ok)
		}
	})
}

func FuzzFormatRecord(f *testing.F) {
	f.Add(int64(0), int64(0))
	f.Add(int64(-1), int64(1<<62))
	f.Add(int64(kvstore.MaxValue), int64(1795327323488854))
	f.Fuzz(func(t *testing.T, v, tm int64) {
		rec := kvstore.Record{Value: v, Time: tm}
		if got, ok := ParseRecord(FormatRecord(rec)); !ok || got != rec {
			t.Fatalf("%+v round-trips to %+v, %v", rec, got, ok)
		}
	})
}
