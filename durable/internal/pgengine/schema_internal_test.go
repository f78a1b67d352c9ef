package pgengine

import "testing"

// TestMigrationLockID checks the constant written out in schema.go against
// the hash it stands for.
func TestMigrationLockID(t *testing.T) {
	if got := hashBytes([]byte("ratekit/pgstore/migrate")); got != migrationLockID {
		t.Fatalf("hashBytes(\"ratekit/pgstore/migrate\") = %d, migrationLockID = %d", got, migrationLockID)
	}
}
