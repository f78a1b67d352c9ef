// Command ratekit-schema prints the SQL that creates the tables, indexes and
// functions of ratekit's PostgreSQL store, for users who run migrations
// themselves (pgstore.Config.DisableAutoMigrate).
//
// Usage:
//
//	go run github.com/ratekit/ratekit/durable/pgstore/cmd/ratekit-schema [-schema name] > ratekit.sql
//
// The schema name defaults to "ratekit"; it must be 1 to 63 lower-case
// letters, digits and underscores.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/ratekit/ratekit/durable/pgstore"
)

func main() {
	schema := flag.String("schema", pgstore.DefaultSchema, "PostgreSQL schema that holds ratekit's tables and functions")
	flag.Parse()
	sql, err := pgstore.SchemaSQL(*schema)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ratekit-schema:", err)
		os.Exit(2)
	}
	fmt.Print(sql)
}
