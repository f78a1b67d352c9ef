package pgengine

// SlidingLogLockID is the advisory lock of a sliding-log key, for tests.
var SlidingLogLockID = logLockID

// MigrationLockID is the advisory lock that serialises migrations, for tests.
const MigrationLockID = migrationLockID

// Unprepared reports whether s turned prepared statements off after a
// pooler refused one, for tests.
func Unprepared(s *Store) bool { return s.unprepared.Load() }
