package pgengine

import (
	"strconv"
	"testing"
)

func TestParseResult(t *testing.T) {
	tests := []struct {
		in   string
		want [5]int64
		ok   bool
	}{
		{"{1,4,0,123,0}", [5]int64{1, 4, 0, 123, 0}, true},
		{"{0,-1,9223372036854775807,-9223372036854775808,1}", [5]int64{0, -1, 9223372036854775807, -9223372036854775808, 1}, true},
		{"", [5]int64{}, false},
		{"{}", [5]int64{}, false},
		{"{1,2,3,4}", [5]int64{}, false},
		{"{1,2,3,4,5,6}", [5]int64{}, false},
		{"{1,2,3,4,5,}", [5]int64{}, false},
		{"{1,2,,4,5}", [5]int64{}, false},
		{"1,2,3,4,5", [5]int64{}, false},
		{"{1,2,3,4,x}", [5]int64{}, false},
		{"{1,2,3,4,99999999999999999999}", [5]int64{}, false},
		{"{NULL,2,3,4,5}", [5]int64{}, false},
	}
	for _, tt := range tests {
		var got [5]int64
		ok := parseResult([]byte(tt.in), &got)
		if ok != tt.ok || (ok && got != tt.want) {
			t.Errorf("parseResult(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzParseResult checks that parseResult never panics and that what it
// accepts is five integers that format back to an equivalent array.
func FuzzParseResult(f *testing.F) {
	f.Add("{1,4,0,123,0}")
	f.Add("{0,0,0,0,0}")
	f.Add("{1,2,3,4,5,}")
	f.Fuzz(func(t *testing.T, s string) {
		var out [5]int64
		if !parseResult([]byte(s), &out) {
			return
		}
		text := "{"
		for i, n := range out {
			if i > 0 {
				text += ","
			}
			text += strconv.FormatInt(n, 10)
		}
		var again [5]int64
		if !parseResult([]byte(text+"}"), &again) || again != out {
			t.Fatalf("%q parsed to %v, which does not round-trip", s, out)
		}
	})
}
