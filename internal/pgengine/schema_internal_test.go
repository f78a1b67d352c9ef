package pgstore

import "testing"

// TestMigrationLockID checks the constant written out in schema.go against
// the hash it stands for.
func TestMigrationLockID(t *testing.T) {
	if got := HashKey("ratekit/pgstore/migrate"); got != migrationLockID {
		t.Fatalf("HashKey(\"ratekit/pgstore/migrate\") = %d, migrationLockID = %d", got, migrationLockID)
	}
}
