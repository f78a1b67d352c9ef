package signedwindow

import (
	"errors"
	"fmt"
	"testing"
)

// TestUnknownVersionError checks that the statically laid out
// ErrTokenUnknownVersion reads and matches as the fmt.Errorf wrapping it
// replaces.
func TestUnknownVersionError(t *testing.T) {
	want := fmt.Errorf("%w: unknown version", ErrTokenMalformed)
	if ErrTokenUnknownVersion.Error() != want.Error() {
		t.Errorf("text %q, want %q", ErrTokenUnknownVersion, want)
	}
	if !errors.Is(ErrTokenUnknownVersion, ErrTokenMalformed) || !errors.Is(fmt.Errorf("x: %w", ErrTokenUnknownVersion), ErrTokenUnknownVersion) {
		t.Error("ErrTokenUnknownVersion does not match ErrTokenMalformed or itself through a wrapping")
	}
}
