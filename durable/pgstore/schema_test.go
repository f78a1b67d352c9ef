package pgstore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/pgstore"
)

func TestSchemaSQL(t *testing.T) {
	if !strings.Contains(pgstore.DefaultSchemaSQL(), `CREATE SCHEMA IF NOT EXISTS "ratekit"`) {
		t.Error("DefaultSchemaSQL does not create schema ratekit")
	}
	sql, err := pgstore.SchemaSQL("billing")
	if err != nil || !strings.Contains(sql, `CREATE SCHEMA IF NOT EXISTS "billing"`) {
		t.Errorf("SchemaSQL(billing): %v", err)
	}
	for _, name := range []string{"", "Billing", "1st", "a-b", `x"y`, strings.Repeat("a", 64)} {
		if _, err := pgstore.SchemaSQL(name); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("SchemaSQL(%q): %v, want ErrInvalidConfig", name, err)
		}
		if _, err := pgstore.New(nil, pgstore.Config{Schema: name}); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("New with schema %q: %v, want ErrInvalidConfig", name, err)
		}
	}
}
