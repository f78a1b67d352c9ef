//go:build !unix

package signedwindow

import "testing"

// reportCPU runs f; CPU time is reported on Unix systems only.
func reportCPU(b *testing.B, f func()) { f() }
