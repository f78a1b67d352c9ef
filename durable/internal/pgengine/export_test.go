package pgengine

// SlidingLogLockID is the advisory lock of a sliding-log key, for tests.
var SlidingLogLockID = logLockID

// MigrationLockID is the advisory lock that serialises migrations, for tests.
const MigrationLockID = migrationLockID
