package pgengine

import "time"

// SlidingLogLockID is the advisory lock of a sliding-log key, for tests.
var SlidingLogLockID = logLockID

// MigrationLockID is the advisory lock that serialises migrations, for tests.
const MigrationLockID = migrationLockID

// Unprepared reports whether s turned prepared statements off after a
// pooler refused one, for tests.
func Unprepared(s *Store) bool { return s.unprepared.Load() }

// FarWindow is a window long enough that no epoch-aligned boundary of a
// fixed or sliding window falls inside a test on the server's real clock,
// for tests that count exactly.
const FarWindow = farWindow

const farWindow = 10000 * time.Hour

// Queued returns how many decisions have waited in s's queue, for tests.
func Queued(s *Store) int64 { return s.co.queued.Load() }
