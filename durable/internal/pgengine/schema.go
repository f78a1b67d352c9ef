package pgengine

import (
	"bytes"
	_ "embed"
	"fmt"
	"strings"
	"sync"
	"text/template"

	"github.com/ratekit/ratekit"
)

// DefaultSchema is the PostgreSQL schema that holds ratekit's tables and
// functions when [Config.Schema] is empty.
const DefaultSchema = "ratekit"

// SchemaVersion is the version of the tables and functions that this package
// creates and calls. The schema SQL creates a marker function named
// ratekit_schema_v<SchemaVersion> last, and automatic migration skips all
// work when it exists.
const SchemaVersion = 19

// maxSchemaNameLen is PostgreSQL's NAMEDATALEN-1.
const maxSchemaNameLen = 63

// ValidateSchemaName reports whether name can be used as [Config.Schema]:
// 1 to 63 bytes of lower-case ASCII letters, digits and '_', starting with a
// letter or '_'. Schema names are identifiers, which cannot be query
// parameters, so this package only accepts names that need no escaping and
// still double-quotes them. The error matches [ratekit.ErrInvalidConfig].
func ValidateSchemaName(name string) error {
	if name == "" || len(name) > maxSchemaNameLen {
		return fmt.Errorf("pgstore: %w: schema name must be 1 to %d bytes, got %d", ratekit.ErrInvalidConfig, maxSchemaNameLen, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', c == '_':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return fmt.Errorf("pgstore: %w: schema name %q has byte %q at %d; use lower-case letters, digits and '_'", ratekit.ErrInvalidConfig, name, c, i)
		}
	}
	return nil
}

// SchemaSQL returns the statements that create ratekit's tables, indexes and
// functions in schema. Every statement is idempotent (CREATE … IF NOT EXISTS,
// CREATE OR REPLACE FUNCTION), so running it again is harmless, but
// concurrent runs can fail on PostgreSQL's catalog constraints: run it from
// one migration job, or let [Store] migrate (it serialises concurrent
// migrations with an advisory lock). It returns an error matching
// [ratekit.ErrInvalidConfig] for an invalid schema name (see
// [ValidateSchemaName]).
func SchemaSQL(schema string) (string, error) {
	if err := ValidateSchemaName(schema); err != nil {
		return "", err
	}
	tmpl, err := schemaTemplate()
	if err != nil {
		return "", fmt.Errorf("pgstore: schema template: %w", err)
	}
	var b bytes.Buffer
	data := schemaData{Schema: `"` + schema + `"`, Version: SchemaVersion, CompositeCode: fnComposite}
	for _, d := range []Durability{Unlogged, Logged} {
		t := &tableData{
			Unlogged:    d == Unlogged,
			Counters:    data.Schema + "." + d.table("counters"),
			CountersRaw: d.table("counters"),
			Log:         data.Schema + "." + d.table("log"),
			LogRaw:      d.table("log"),
			Idem:        data.Schema + "." + d.table("idempotency"),
			IdemRaw:     d.table("idempotency"),
			Composite:   data.Schema + "." + d.table("composite"),
			Reset:       data.Schema + "." + d.table("reset"),
			Cleanup:     data.Schema + "." + d.table("cleanup"),
			Usage:       data.Schema + "." + d.table("period_usage"),
		}
		for _, a := range singleAlgorithms {
			span := "p_window_us"
			if a == "token_bucket" {
				span = "p_interval_us"
			}
			f := flowData{tableData: t, Alg: a, Function: data.Schema + "." + d.table(a), Span: span,
				IdemPrefix: "p_prefix", IdemKey: "p_key", Admitted: "admits"}
			if tmpl.Lookup(a+".many_set") != nil {
				f.Many = data.Schema + "." + d.table(manyFunction(a))
			}
			t.Singles = append(t.Singles, f)
			data.BatchCases = append(data.BatchCases, batchCase{Index: functionIndex(d, a), Function: data.Schema + "." + d.table(a)})
		}
		data.BatchCases = append(data.BatchCases, batchCase{Index: compositeIndex(d), Function: t.Composite, Composite: true})
		t.CompositeFlow = flowData{tableData: t, InComposite: true, Algorithms: compositeAlgorithms,
			IdemPrefix: "p_idem_prefix", IdemKey: "p_idem_key", Admitted: "all_admit", TagPrefix: "composite_"}
		data.Tables = append(data.Tables, t)
	}
	if err := tmpl.Execute(&b, data); err != nil {
		return "", fmt.Errorf("pgstore: schema template: %w", err)
	}
	return b.String(), nil
}

// migrateSQL wraps the schema SQL in one DO block that does nothing when the
// version marker exists and otherwise takes a transaction-level advisory lock
// so that racing cold starts create the schema one at a time.
//
// Under the lock, the block looks for the marker again in pg_proc itself: a
// query there reads a snapshot taken after the lock was granted, and so sees
// a migration that committed while this one waited. to_regprocedure, like
// every lookup by name, reads the catalog caches, which an advisory lock
// does not refresh: it would miss that commit, and the DDL would run again,
// taking table locks that deadlock with the other instance's decisions.
func migrateSQL(schema string) (string, error) {
	ddl, err := SchemaSQL(schema)
	if err != nil {
		return "", err
	}
	marker := fmt.Sprintf(`'"%s".ratekit_schema_v%d()'`, schema, SchemaVersion)
	var b strings.Builder
	b.WriteString("DO $ratekit_migrate$\nBEGIN\n")
	fmt.Fprintf(&b, "IF to_regprocedure(%s) IS NOT NULL THEN RETURN; END IF;\n", marker)
	fmt.Fprintf(&b, "PERFORM pg_advisory_xact_lock(%d);\n", migrationLockID)
	fmt.Fprintf(&b, "IF EXISTS (SELECT FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace"+
		" WHERE n.nspname = '%s' AND p.proname = 'ratekit_schema_v%d' AND p.pronargs = 0) THEN RETURN; END IF;\n", schema, SchemaVersion)
	b.WriteString(ddl)
	b.WriteString("END\n$ratekit_migrate$")
	return b.String(), nil
}

// migrationLockID is the advisory lock that serialises schema migrations:
// hashBytes("ratekit/pgstore/migrate"), the first 8 bytes of its SHA-256.
// The value is written out, and held equal to that hash, so that importing
// the package hashes nothing.
const migrationLockID = 8689334289248001880

type schemaData struct {
	Schema        string
	Version       int
	Tables        []*tableData
	BatchCases    []batchCase
	CompositeCode int32 // fnComposite
}

// A batchCase is one decision function that the batch function calls: the
// number that names it in the batch's p_fn array (functionIndex or
// compositeIndex), its qualified name, and whether it is a composite
// function.
type batchCase struct {
	Index     int32
	Function  string
	Composite bool
}

// functionIndex is the number that names the single-key function of
// algorithm a (its name in sqlCodes) with d in the batch function's p_fn.
func functionIndex(d Durability, a string) int32 {
	return 10*int32(d) + int32(sqlCodes["alg"][a])
}

// compositeIndex is the number that names the composite function with d in
// the batch function's p_fn.
func compositeIndex(d Durability) int32 { return 10*int32(d) + fnComposite }

type tableData struct {
	Unlogged                     bool
	Counters, Log, Idem          string
	CountersRaw, LogRaw, IdemRaw string
	Composite, Reset, Cleanup    string
	Usage                        string
	// Singles are the single-key decision functions, CompositeFlow the
	// composite function.
	Singles       []flowData
	CompositeFlow flowData
}

// flowData is what the templates of a decision function read: its tables,
// and the names its flow gives the parts that differ between a single-key
// function and the composite.
type flowData struct {
	*tableData
	Alg         string   // a single-key function's algorithm
	Function    string   // a single-key function's qualified name
	Many        string   // its set-based take's qualified name, or "" for none
	Span        string   // a single-key function's p_window_us or p_interval_us
	InComposite bool     // the composite function
	Algorithms  []string // the composite's algorithms, one CASE arm each
	Phase       string   // the algorithms' block that "arms" runs
	IdemPrefix  string   // where the idempotency records are kept: prefix
	IdemKey     string   // and key
	Admitted    string   // true when the decision admits
	TagPrefix   string   // "" or "composite_": the idempotency tags' names
}

// schemaSource is schema.sql: a text/template of the schema SQL, executed
// with a schemaData. The single-key decision functions share one signature:
//
//	p_op       the operation: the code of take, peek or refund (codes.go)
//	p_prefix   limiter prefix (text, validated by the caller)
//	p_key      request key (bytea: any bytes)
//	p_cost     units to take, test or give back
//	p_quota    quota per window (windows, log) or burst (bucket)
//	p_window_us window length in microseconds; for the token bucket
//	           p_interval_us, its emission interval: the time one unit takes
//	           to come back
//	p_lock     advisory lock key of (prefix, key) (sliding log only)
//	p_idem     idempotency key or NULL
//	p_idem_ttl_us how long an idempotency key is remembered
//	p_cleanup  number of expired rows of the prefix to delete, 0 for none
//	p_sync     false sets synchronous_commit to off for this transaction
//
// They return ARRAY[allowed (0 or 1), remaining, retry_after_us,
// reset_after_us, duplicate (0 or 1)]: a scalar array is cheaper for the
// server to return than a record from a set-returning call. Times are
// integer microseconds since the Unix epoch, read once per call from
// clock_timestamp(): by a take or refund only once it holds the key's lock
// (the row lock, or the advisory lock for the sliding log), by a peek after
// it has read the state, so that no decision sees the effect of one that
// read a later time.
//
// Each algorithm's rules are written once, as the template blocks
// "<algorithm>.roll", ".take", ".refund" and ".report", which both the
// algorithm's single-key function and the composite function run; they
// are templates rather than functions of their own so that a decision
// makes no extra function call. The fixed window's and the token bucket's
// rules are expressions of a state and a clock (named by [ruleNames]'s
// maps: "locals" for the functions, "statement" for the take statement),
// which these blocks and the take statement ([takeSQL]) share.
//
//go:embed schema.sql
var schemaSource string

var (
	schemaOnce    sync.Once
	schemaTmpl    *template.Template
	schemaTmplErr error
)

// schemaTemplate returns schema.sql parsed as a text/template, parsing it on
// first use: importing the package does no work.
func schemaTemplate() (*template.Template, error) {
	schemaOnce.Do(func() {
		var t *template.Template
		code := func(kind string) func(string) (int64, error) {
			return func(name string) (int64, error) {
				c, ok := sqlCodes[kind][name]
				if !ok {
					return 0, fmt.Errorf("no %s code named %q", kind, name)
				}
				return c, nil
			}
		}
		funcs := template.FuncMap{
			"op":  code("op"),
			"alg": code("alg"),
			"tag": code("tag"),
			// include runs the template named name, which may be computed.
			"include": func(name string, data any) (string, error) {
				var b strings.Builder
				err := t.ExecuteTemplate(&b, name, data)
				return b.String(), err
			},
			// indent indents every line of s by n tabs.
			"indent": func(n int, s string) string {
				tabs := strings.Repeat("\t", n)
				return tabs + strings.ReplaceAll(s, "\n", "\n"+tabs)
			},
			// locals returns the names an algorithm's rule expressions
			// read (see schema.sql) as a decision function's locals,
			// with the names and values of extra added.
			"locals": func(alg string, extra ...string) (map[string]string, error) {
				span := "window_us"
				if alg == "token_bucket" {
					span = "interval_us"
				}
				return ruleNames(extra, "Tat", "tat", "Now", "now_us", "Start", "window_start", "Used", "used",
					"Aligned", "aligned_start", "Cost", "cost", "Quota", "quota", "Span", span)
			},
			// statement returns the names the rule expressions read in
			// the take statement: its parameters, and the names and
			// values of extra.
			"statement": func(extra ...string) (map[string]string, error) {
				return ruleNames(extra, "Cost", "$3::bigint", "Quota", "$4::bigint", "Span", "$5::bigint")
			},
			// many returns the names the rule expressions read in
			// the set-based take: its parameters, the clock it read,
			// a key's total cost, and the names and values of extra.
			"many": func(extra ...string) (map[string]string, error) {
				return ruleNames(extra, "Now", "now_us", "Cost", "g.total", "Quota", "p_quota", "Span", "p_span")
			},
			// phase returns f for the phase's "arms".
			"phase": func(phase string, f flowData) flowData {
				f.Phase = phase
				return f
			},
		}
		t, schemaTmplErr = template.New("schema").Funcs(funcs).Parse(schemaSource)
		schemaTmpl = t
	})
	return schemaTmpl, schemaTmplErr
}

// ruleNames returns the names and values of base, then those of extra
// (which replace base's), as a map.
func ruleNames(extra []string, base ...string) (map[string]string, error) {
	if len(extra)%2 != 0 {
		return nil, fmt.Errorf("odd number of names and values %q", extra)
	}
	m := make(map[string]string, (len(base)+len(extra))/2)
	for _, kv := range [][]string{base, extra} {
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
	}
	return m, nil
}

// manyFunction returns the name, without schema or table suffix, of the
// set-based take of algorithm alg (its name in sqlCodes).
func manyFunction(alg string) string { return "take_many_" + alg }

// manySQL returns the statement that calls the set-based take (schema.sql's
// "many") of a counter of algorithm alg on the tables of d in the schema
// quoted, or "" when alg has none. Its result is the function's array in
// text form.
func manySQL(quoted string, d Durability, alg string) (string, error) {
	tmpl, err := schemaTemplate()
	if err != nil {
		return "", fmt.Errorf("pgstore: schema template: %w", err)
	}
	if tmpl.Lookup(alg+".many_set") == nil {
		return "", nil
	}
	return batchMarker + "SELECT " + quoted + "." + d.table(manyFunction(alg)) +
		"($1::text, $2::bytea[], $3::bigint[], $4::int[], $5::bigint[], $6::bigint, $7::bigint, $8::boolean)::text", nil
}

// takeSQL returns the take statement of schema.sql ("take") for a counter
// of algorithm alg (its name in sqlCodes) on the tables of d in the schema
// quoted (a quoted identifier), or "" when alg has none (no "<alg>.row"
// block). sync false turns synchronous_commit off for the statement's
// transaction.
func takeSQL(quoted string, d Durability, alg string, sync bool) (string, error) {
	tmpl, err := schemaTemplate()
	if err != nil {
		return "", fmt.Errorf("pgstore: schema template: %w", err)
	}
	if tmpl.Lookup(alg+".row") == nil {
		return "", nil
	}
	var b strings.Builder
	data := struct {
		Alg, Counters string
		Sync          bool
	}{alg, quoted + "." + d.table("counters"), sync}
	if err := tmpl.ExecuteTemplate(&b, "take", data); err != nil {
		return "", fmt.Errorf("pgstore: schema template: %w", err)
	}
	return b.String(), nil
}
