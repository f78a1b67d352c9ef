package pgengine

// SlidingLogLockID is the advisory lock of a sliding-log key, for tests.
var SlidingLogLockID = logLockID
