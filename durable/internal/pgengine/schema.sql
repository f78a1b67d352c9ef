{{- /*
schema.sql is a text/template that SchemaSQL executes with a schemaData (see
schema.go, which also documents the decision functions' shared signature).
Nothing of this comment reaches the output.
*/ -}}
-- ratekit pgstore schema, version {{.Version}}.
-- Functions are dropped before they are created because CREATE OR REPLACE
-- cannot change a function's result type, as an upgrade from an earlier
-- version may need; run this in one transaction.
-- Keys are bytea (any bytes); prefixes are text. Times are microseconds since
-- the Unix epoch, read from the database clock.
-- Every function that reads a table runs with enable_seqscan off. A
-- function's statements are planned once per session and the plans kept:
-- planned while a table was tiny as last analysed, a look-up by key would
-- stay a scan of the whole table as the table grows, until the next
-- ANALYZE, and the planner takes every row for expired once the clock has
-- passed the last bucket of the expiry histogram. Every statement here has
-- an index to go through; the setting costs under a microsecond per call.
CREATE SCHEMA IF NOT EXISTS {{.Schema}};
{{range .Tables}}
CREATE {{if .Unlogged}}UNLOGGED {{end}}TABLE IF NOT EXISTS {{.Counters}} (
	prefix text NOT NULL, key bytea NOT NULL,
	window_start_us bigint NOT NULL DEFAULT 0, count bigint NOT NULL DEFAULT 0, prev_count bigint NOT NULL DEFAULT 0,
	tat_us bigint NOT NULL DEFAULT 0,
	expires_at_us bigint NOT NULL,
	PRIMARY KEY (prefix, key)
) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS {{.CountersRaw}}_expiry ON {{.Counters}} (prefix, expires_at_us);

CREATE {{if .Unlogged}}UNLOGGED {{end}}TABLE IF NOT EXISTS {{.Log}} (
	prefix text NOT NULL, key bytea NOT NULL,
	at_us bigint NOT NULL, cost bigint NOT NULL, expires_at_us bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS {{.LogRaw}}_key ON {{.Log}} (prefix, key, expires_at_us);
CREATE INDEX IF NOT EXISTS {{.LogRaw}}_expiry ON {{.Log}} (prefix, expires_at_us);

CREATE {{if .Unlogged}}UNLOGGED {{end}}TABLE IF NOT EXISTS {{.Idem}} (
	prefix text NOT NULL, key bytea NOT NULL, idempotency_key bytea NOT NULL,
	expires_at_us bigint NOT NULL,
	PRIMARY KEY (prefix, key, idempotency_key)
);
CREATE INDEX IF NOT EXISTS {{.IdemRaw}}_expiry ON {{.Idem}} (prefix, expires_at_us);

-- The units each key used in each ended period of a calendar-period policy
-- (the composite function's period algorithm), moved here from the counter row, in the
-- transaction that starts the key's next period: a period's usage is in
-- the counter row while it is the row's period and here after, never in
-- both, so one statement that reads both is exact. Nothing deletes these
-- rows: they are billing records.
CREATE {{if .Unlogged}}UNLOGGED {{end}}TABLE IF NOT EXISTS {{.Usage}} (
	prefix text NOT NULL, key bytea NOT NULL,
	period_start_us bigint NOT NULL, period_end_us bigint NOT NULL, used bigint NOT NULL,
	PRIMARY KEY (prefix, period_start_us, key)
);

-- Cleanup: delete up to p_max_rows rows of each table under p_prefix that
-- expired before p_before, skipping rows locked by others, and return how
-- many of each (counters, log entries, idempotency records), found through
-- the expiry indexes (see enable_seqscan above).
DROP FUNCTION IF EXISTS {{.Cleanup}}(text, bigint, bigint);
CREATE OR REPLACE FUNCTION {{.Cleanup}}(p_prefix text, p_before bigint, p_max_rows bigint)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	counters_deleted bigint;
	log_deleted bigint;
	records_deleted bigint;
BEGIN
	DELETE FROM {{.Counters}} AS x WHERE x.ctid = ANY (ARRAY(
		SELECT e.ctid FROM {{.Counters}} AS e WHERE e.prefix = p_prefix AND e.expires_at_us < p_before
		LIMIT p_max_rows FOR UPDATE SKIP LOCKED));
	GET DIAGNOSTICS counters_deleted = ROW_COUNT;
	DELETE FROM {{.Log}} AS x WHERE x.ctid = ANY (ARRAY(
		SELECT e.ctid FROM {{.Log}} AS e WHERE e.prefix = p_prefix AND e.expires_at_us < p_before
		LIMIT p_max_rows FOR UPDATE SKIP LOCKED));
	GET DIAGNOSTICS log_deleted = ROW_COUNT;
	DELETE FROM {{.Idem}} AS x WHERE x.ctid = ANY (ARRAY(
		SELECT e.ctid FROM {{.Idem}} AS e WHERE e.prefix = p_prefix AND e.expires_at_us < p_before
		LIMIT p_max_rows FOR UPDATE SKIP LOCKED));
	GET DIAGNOSTICS records_deleted = ROW_COUNT;
	RETURN ARRAY[counters_deleted, log_deleted, records_deleted];
END
$fn$;
{{range .Singles}}{{template "single" .}}{{end}}
{{range .Singles}}{{if .Many}}{{template "many" .}}{{end}}{{end}}
{{with .CompositeFlow}}
-- Composite: several policies over one table set, one decision. Element i
-- of the arrays is policy i: p_algs[i] its algorithm's code (see "Codes"
-- in schema.go), p_windows[i] its window or, for the token bucket, its
-- emission interval, p_ttls[i] how long its rows are kept after they
-- expire; the other arguments as for the single-key functions. A take or
-- refund first locks every policy's key in one fixed order, by key and
-- then prefix (byte order), so that two composites over the same keys, and
-- batches, never deadlock: the counter row (created when missing, as a single-key take
-- creates it) or, for the sliding log, the advisory lock. Only then does it
-- read the clock. A take admits only when every policy admits, and then
-- takes from every policy; otherwise it writes nothing. A peek locks
-- nothing and reads the clock after the counters. The idempotency record
-- (p_idem_prefix, p_idem_key, p_idem) covers the whole decision.
--
-- The period algorithm is a fixed window over calendar periods. The client
-- computes them with its own clock and passes, in p_bounds[4i-3 .. 4i],
-- four boundaries b0 < b1 < b2 < b3 (microseconds since the epoch): the
-- period that contains its now and its two neighbours. The function picks
-- the one that contains the database's now, so that decisions use one
-- clock, the database's, and calendar arithmetic lives in one place, the
-- client; a database now outside [b0, b3) (clocks more than a period apart)
-- raises SQLSTATE RK001 and decides nothing. The counter row holds the
-- period's start in window_start_us and its end in expires_at_us; a take
-- that starts a new period moves the ended period's count to the usage
-- table. A refund whose idempotency key names a take of this scope gives
-- nothing back to a period that started after that take (the take's time is
-- its record's expiry less p_idem_ttl_us).
--
-- Returns ARRAY[duplicate, then for each policy allowed, remaining,
-- retry_after_us, reset_after_us, period_us (the length of the period
-- counted in, 0 for the other algorithms), used (the units counted in the
-- window or period; quota - remaining for the sliding window and the token
-- bucket)].
DROP FUNCTION IF EXISTS {{.Composite}}(bigint, bigint[], text[], bytea[], bigint[], bigint[], bigint[], bigint[], bigint[], text, bytea, bytea, bigint, bigint, boolean);
DROP FUNCTION IF EXISTS {{.Composite}}(bigint, bigint[], text[], bytea[], bigint[], bigint[], bigint[], bigint[], bigint[], text, bytea, bytea, bigint, bigint, boolean, bigint[]);
CREATE OR REPLACE FUNCTION {{.Composite}}(
	p_op bigint, p_algs bigint[], p_prefixes text[], p_keys bytea[], p_costs bigint[],
	p_quotas bigint[], p_windows bigint[], p_ttls bigint[], p_locks bigint[],
	p_idem_prefix text, p_idem_key bytea, p_idem bytea, p_idem_ttl_us bigint,
	p_cleanup bigint, p_sync boolean, p_bounds bigint[])
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	n int := cardinality(p_keys);
	i int;
	j int;
	lock_order int[];
	quota bigint;
	cost bigint;
	window_us bigint;
	interval_us bigint;
	policy_prefix text;
	policy_key bytea;
{{- template "locals"}}
	-- Each policy's state, kept between the pass that reads and rolls it
	-- and the pass that writes and reports it.
	row_ids tid[];
	starts bigint[];
	useds bigint[];
	prev_useds bigint[];
	tats bigint[];
	last_expiries bigint[];
	read_starts bigint[];
	read_useds bigint[];
	read_expiries bigint[];
	period_starts bigint[];
	period_ends bigint[];
	admitted boolean[];
	all_admit boolean := true;
	charged_at bigint;
	result bigint[];
BEGIN
	IF n IS NULL OR n < 1 OR cardinality(p_algs) <> n OR cardinality(p_prefixes) <> n OR cardinality(p_costs) <> n
		OR cardinality(p_quotas) <> n OR cardinality(p_windows) <> n OR cardinality(p_ttls) <> n OR cardinality(p_locks) <> n
		OR cardinality(p_bounds) IS DISTINCT FROM 4 * n THEN
		RAISE EXCEPTION 'ratekit: composite arrays must be non-empty and of equal length' USING ERRCODE = '22023';
	END IF;
	IF p_op <> {{op "peek"}} AND NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	starts := array_fill(0::bigint, ARRAY[n]);
	useds := starts; prev_useds := starts; tats := starts; last_expiries := starts;
	read_starts := starts; read_useds := starts; read_expiries := starts; period_starts := starts; period_ends := starts;
	row_ids := array_fill(NULL::tid, ARRAY[n]);
	admitted := array_fill(true, ARRAY[n]);
	IF p_op <> {{op "peek"}} THEN
		-- The lock order: by key, then prefix, in byte order (an insertion
		-- sort; composites are small), as a batch orders its decisions.
		lock_order := ARRAY[1];
		FOR i IN 2..n LOOP
			j := i - 1;
			lock_order := lock_order || i;
			WHILE j >= 1 AND (p_keys[lock_order[j]] > p_keys[i]
				OR p_keys[lock_order[j]] = p_keys[i] AND p_prefixes[lock_order[j]] COLLATE "C" > p_prefixes[i] COLLATE "C") LOOP
				lock_order[j + 1] := lock_order[j];
				j := j - 1;
			END LOOP;
			lock_order[j + 1] := i;
		END LOOP;
		-- Lock each key and read its state under the lock; a take or a
		-- refund creates a missing row in a state that means the same as no
		-- row. So a refund waits for a take that is creating a key's rows
		-- and sees all of that take or none of it (reading one policy's new
		-- row and not yet another's would refund only part of it), and
		-- idempotency records are touched only under the key's lock (see
		-- the reset function).
		FOREACH i IN ARRAY lock_order LOOP
			IF p_algs[i] = {{alg "sliding_log"}} THEN
				PERFORM pg_advisory_xact_lock(p_locks[i]);
			ELSE
				policy_prefix := p_prefixes[i]; policy_key := p_keys[i];
{{include "lockrow" . | indent 3}}
				row_ids[i] := row_id; starts[i] := window_start; useds[i] := used; prev_useds[i] := prev_used;
				tats[i] := tat; read_expiries[i] := read_expiry;
			END IF;
		END LOOP;
		now_us := {{template "clock"}};
	ELSE
		-- A peek locks nothing. It reads every policy's state in one
		-- statement, so in one snapshot: reading them one statement each
		-- could see a take between two of them and report a state that
		-- never was. The clock is read after the snapshot is taken, so
		-- every decision the peek sees read its clock no later; the logs
		-- are summed at that clock.
		SELECT min(x.now_us), array_agg(x.window_start ORDER BY x.i), array_agg(x.used ORDER BY x.i),
			array_agg(x.prev_used ORDER BY x.i), array_agg(x.tat ORDER BY x.i), array_agg(x.last_expiry ORDER BY x.i)
		INTO now_us, starts, useds, prev_useds, tats, last_expiries
		FROM (
			SELECT u.i, t.now_us, COALESCE(c.window_start_us, 0) AS window_start,
				CASE WHEN u.alg = {{alg "sliding_log"}} THEN COALESCE(l.used, 0) ELSE COALESCE(c.count, 0) END AS used,
				COALESCE(c.prev_count, 0) AS prev_used, COALESCE(c.tat_us, 0) AS tat, COALESCE(l.last, 0) AS last_expiry
			FROM unnest(p_prefixes, p_keys, p_algs) WITH ORDINALITY AS u(prefix, key, alg, i)
			CROSS JOIN (SELECT {{template "clock"}} AS now_us OFFSET 0) AS t
			LEFT JOIN {{.Counters}} AS c ON u.alg <> {{alg "sliding_log"}} AND c.prefix = u.prefix AND c.key = u.key
			LEFT JOIN LATERAL (
				SELECT sum(g.cost)::bigint AS used, max(g.expires_at_us) AS last FROM {{.Log}} AS g
				WHERE u.alg = {{alg "sliding_log"}} AND g.prefix = u.prefix AND g.key = u.key AND g.expires_at_us + 0 > t.now_us
			) AS l ON true
		) AS x;
	END IF;
	-- Roll each policy's state forward to now (a missing row reads as
	-- zeros, which means the same as no row) and ask whether it would
	-- admit its cost.
	FOR i IN 1..n LOOP
{{template "load"}}
		IF p_op = {{op "take"}} AND (cost < 1 OR cost > quota) THEN
			RAISE EXCEPTION 'ratekit: cost % of policy % is outside 1..%', cost, i, quota USING ERRCODE = '22023';
		END IF;
{{include "arms" (phase "roll" .) | indent 2}}
		starts[i] := window_start; useds[i] := used; prev_useds[i] := prev_used; tats[i] := tat; last_expiries[i] := last_expiry;
		admitted[i] := admits;
		all_admit := all_admit AND admits;
	END LOOP;
{{template "remember" .}}
	IF p_op = {{op "refund"}} AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- When the take this refund undoes is on record, its time.
		SELECT x.expires_at_us - p_idem_ttl_us INTO charged_at FROM {{.Idem}} AS x
		WHERE x.prefix = p_idem_prefix AND x.key = p_idem_key
			AND x.idempotency_key = set_byte(p_idem, 0, {{tag "composite_take"}}) AND x.expires_at_us > now_us;
	END IF;
	-- Take from every policy (when all admit) or refund to every policy,
	-- and report each.
	result := ARRAY[duplicate::int::bigint];
	FOR i IN 1..n LOOP
{{template "load"}}
		row_id := row_ids[i]; read_start := read_starts[i]; read_used := read_useds[i]; read_expiry := read_expiries[i];
		period_start := period_starts[i]; period_end := period_ends[i];
		allowed := p_op = {{op "refund"}} OR duplicate OR admitted[i];
		IF p_op = {{op "take"}} AND NOT duplicate AND all_admit THEN
{{include "arms" (phase "take" .) | indent 3}}
		ELSIF p_op = {{op "refund"}} AND NOT duplicate THEN
{{include "arms" (phase "refund" .) | indent 3}}
		END IF;
{{include "arms" (phase "report" .) | indent 2}}
		result := result || ARRAY[allowed::int::bigint, remaining, retry_after_us, reset_after_us,
			period_end - period_start,
			CASE WHEN p_algs[i] IN ({{alg "sliding_window"}}, {{alg "token_bucket"}}) THEN quota - remaining ELSE used END];
	END LOOP;
{{template "forget" .}}
	IF p_cleanup > 0 THEN
		FOR i IN 1..n LOOP
			PERFORM {{.Cleanup}}(p_prefixes[i], now_us - p_ttls[i], p_cleanup);
		END LOOP;
	END IF;
	RETURN result;
END
$fn$;
{{end}}
-- Reset: forget p_key under each of p_prefixes (counter rows, log entries,
-- idempotency records). It first takes the locks a take of the same keys
-- takes, in the same order (for one key, prefix in byte order; the
-- advisory lock for a sliding log, the counter row otherwise), and deletes
-- only then: every transaction that locks more than one of these rows
-- locks them in that order, so a reset racing takes and refunds of its key
-- cannot deadlock with them. It returns the rows deleted.
DROP FUNCTION IF EXISTS {{.Reset}}(text[], bytea, bigint[], bigint[]);
CREATE OR REPLACE FUNCTION {{.Reset}}(p_prefixes text[], p_key bytea, p_algs bigint[], p_locks bigint[])
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	i bigint;
	counters_deleted bigint;
	log_deleted bigint;
	records_deleted bigint;
BEGIN
	IF coalesce(cardinality(p_prefixes), 0) < 1 OR cardinality(p_algs) IS DISTINCT FROM cardinality(p_prefixes)
		OR cardinality(p_locks) IS DISTINCT FROM cardinality(p_prefixes) THEN
		RAISE EXCEPTION 'ratekit: reset arrays must be non-empty and of equal length' USING ERRCODE = '22023';
	END IF;
	FOR i IN SELECT u.o FROM unnest(p_prefixes) WITH ORDINALITY AS u(p, o) ORDER BY u.p COLLATE "C", u.o LOOP
		IF p_algs[i] = {{alg "sliding_log"}} THEN
			PERFORM pg_advisory_xact_lock(p_locks[i]);
		ELSE
			-- A missing row is created, as a take creates it, so that a take
			-- that would create it waits for the reset too; it is deleted
			-- below with the rest.
			LOOP
				PERFORM 1 FROM {{.Counters}} AS x WHERE x.prefix = p_prefixes[i] AND x.key = p_key FOR UPDATE;
				EXIT WHEN FOUND;
				INSERT INTO {{.Counters}} (prefix, key, expires_at_us) VALUES (p_prefixes[i], p_key, 0)
				ON CONFLICT (prefix, key) DO NOTHING;
				EXIT WHEN FOUND;
			END LOOP;
		END IF;
	END LOOP;
	DELETE FROM {{.Counters}} AS x WHERE x.prefix = ANY (p_prefixes) AND x.key = p_key;
	GET DIAGNOSTICS counters_deleted = ROW_COUNT;
	DELETE FROM {{.Log}} AS x WHERE x.prefix = ANY (p_prefixes) AND x.key = p_key;
	GET DIAGNOSTICS log_deleted = ROW_COUNT;
	DELETE FROM {{.Idem}} AS x WHERE x.prefix = ANY (p_prefixes) AND x.key = p_key;
	GET DIAGNOSTICS records_deleted = ROW_COUNT;
	RETURN counters_deleted + log_deleted + records_deleted;
END
$fn$;
{{end}}
-- Batch: the decisions of several callers in one statement, one round trip
-- and one commit. Element i of the p_ arrays is one call of a decision
-- function above: p_fn[i] names it (see BatchCases in schema.go) and the
-- other p_ arrays hold its arguments (p_window_or_interval_us[i] is the
-- window, or the token bucket's emission interval). A composite's element
-- has p_parts[i] policies (0 for a single-key call): their arguments are
-- the next p_parts[i] elements of the c_ arrays (four of c_bounds each), and
-- p_prefix[i], p_key[i], p_idem[i], p_idem_ttl_us[i], p_cleanup[i] and
-- p_sync[i] are its idempotency prefix, key, record and lifetime, its cleanup
-- and p_sync (p_cost, p_quota, p_window_or_interval_us and p_lock are
-- unused). The calls run in array order, which the caller sorts into the
-- lock order; each sees every earlier one, as it would alone. A statement
-- that calls this one function costs the server little to plan; one that
-- called the decision functions itself would cost much more, at every round
-- trip, since exec mode and a transaction-mode pooler leave every statement
-- unprepared. Returns the calls' results one after another in one array, in
-- array order: five elements for a single-key call, 1 + 6 × its policies
-- for a composite's.
DROP FUNCTION IF EXISTS {{.Schema}}.batch(int[], bigint[], text[], bytea[], bigint[], bigint[], bigint[], bigint[], bytea[], bigint[], bigint[], boolean[]);
DROP FUNCTION IF EXISTS {{.Schema}}.batch(int[], bigint[], text[], bytea[], bigint[], bigint[], bigint[], bigint[], bytea[], bigint[], bigint[], boolean[],
	int[], bigint[], text[], bytea[], bigint[], bigint[], bigint[], bigint[], bigint[], bigint[]);
CREATE OR REPLACE FUNCTION {{.Schema}}.batch(
	p_fn int[], p_op bigint[], p_prefix text[], p_key bytea[], p_cost bigint[], p_quota bigint[],
	p_window_or_interval_us bigint[], p_lock bigint[], p_idem bytea[], p_idem_ttl_us bigint[], p_cleanup bigint[], p_sync boolean[],
	p_parts int[], c_algs bigint[], c_prefixes text[], c_keys bytea[], c_costs bigint[], c_quotas bigint[], c_windows bigint[],
	c_ttls bigint[], c_locks bigint[], c_bounds bigint[])
RETURNS bigint[] LANGUAGE plpgsql AS $fn$
DECLARE
	n int := cardinality(p_fn);
	m int := coalesce(cardinality(c_algs), 0);
	o int := 1; -- the first c_ element of the next composite
	k int;
	r bigint[];
	res bigint[] := '{}';
BEGIN
	IF n IS NULL OR n < 1 OR cardinality(p_op) <> n OR cardinality(p_prefix) <> n OR cardinality(p_key) <> n
		OR cardinality(p_cost) <> n OR cardinality(p_quota) <> n OR cardinality(p_window_or_interval_us) <> n
		OR cardinality(p_lock) <> n OR cardinality(p_idem) <> n OR cardinality(p_idem_ttl_us) <> n
		OR cardinality(p_cleanup) <> n OR cardinality(p_sync) <> n OR cardinality(p_parts) <> n
		OR coalesce(cardinality(c_prefixes), 0) <> m OR coalesce(cardinality(c_keys), 0) <> m
		OR coalesce(cardinality(c_costs), 0) <> m OR coalesce(cardinality(c_quotas), 0) <> m
		OR coalesce(cardinality(c_windows), 0) <> m OR coalesce(cardinality(c_ttls), 0) <> m
		OR coalesce(cardinality(c_locks), 0) <> m OR coalesce(cardinality(c_bounds), 0) <> 4 * m
		OR (SELECT coalesce(sum(x), 0) FROM unnest(p_parts) AS x) <> m THEN
		RAISE EXCEPTION 'ratekit: batch arrays must be non-empty and of equal length' USING ERRCODE = '22023';
	END IF;
	FOR i IN 1..n LOOP
		k := p_parts[i];
		IF k IS NULL OR k < 0 OR (k > 0) <> (p_fn[i] % 10 = {{.CompositeCode}}) THEN
			RAISE EXCEPTION 'ratekit: batch element % has % policies for function %', i, k, p_fn[i] USING ERRCODE = '22023';
		END IF;
		CASE p_fn[i]
{{- range .BatchCases}}
		WHEN {{.Index}} THEN
{{- if .Composite}}
			r := {{.Function}}(p_op[i], c_algs[o:o + k - 1], c_prefixes[o:o + k - 1], c_keys[o:o + k - 1], c_costs[o:o + k - 1],
				c_quotas[o:o + k - 1], c_windows[o:o + k - 1], c_ttls[o:o + k - 1], c_locks[o:o + k - 1],
				p_prefix[i], p_key[i], p_idem[i], p_idem_ttl_us[i], p_cleanup[i], p_sync[i], c_bounds[4 * o - 3:4 * (o + k - 1)]);
{{- else}}
			r := {{.Function}}(p_op[i], p_prefix[i], p_key[i], p_cost[i], p_quota[i], p_window_or_interval_us[i],
				p_lock[i], p_idem[i], p_idem_ttl_us[i], p_cleanup[i], p_sync[i]);
{{- end}}
{{- end}}
		END CASE;
		o := o + k;
		res := res || r;
	END LOOP;
	RETURN res;
END
$fn$;

-- Version marker, created last: automatic migration skips all of the above
-- when it exists.
CREATE OR REPLACE FUNCTION {{.Schema}}.ratekit_schema_v{{.Version}}() RETURNS integer
LANGUAGE sql IMMUTABLE AS 'SELECT {{.Version}}';
{{- /*
The single-key decision function of one algorithm. Each algorithm's rules
are written once, in the blocks named after it below (roll, take, refund,
report), which this function and the composite both run on the same
locals.
*/ -}}
{{define "single"}}
{{- if eq .Alg "fixed_window"}}
-- Fixed window: windows aligned to the epoch; the row counts the units
-- taken in the window that starts at window_start_us.
{{- else if eq .Alg "sliding_window"}}
-- Sliding window: the two-window weighted count. The estimate of the units
-- in the rolling window is prev_count * (window - elapsed) / window + count;
-- the comparison is done in numeric so it is exact.
{{- else if eq .Alg "token_bucket"}}
-- Token bucket as the generic cell rate algorithm (GCRA, ITU-T I.371):
-- tat_us is the theoretical arrival time, p_interval_us the emission
-- interval (the time one unit takes to come back), and the bucket holds
-- p_quota units.
{{- else}}
-- Sliding log: one row per admitted request. The transaction-level advisory
-- lock p_lock serialises the decisions of one (prefix, key); the clock is
-- read after it is granted, so every decision sees all earlier ones.
{{- end}}
-- A take decides on the state read under the key's lock and writes only
-- when it admits.
DROP FUNCTION IF EXISTS {{.Function}}({{template "args"}});
CREATE OR REPLACE FUNCTION {{.Function}}(
	p_op bigint, p_prefix text, p_key bytea, p_cost bigint, p_quota bigint, {{.Span}} bigint,
	p_lock bigint, p_idem bytea, p_idem_ttl_us bigint, p_cleanup bigint, p_sync boolean)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	policy_prefix ALIAS FOR p_prefix;
	policy_key ALIAS FOR p_key;
	cost ALIAS FOR p_cost;
	quota ALIAS FOR p_quota;
	{{if eq .Alg "token_bucket"}}interval_us ALIAS FOR p_interval_us{{else}}window_us ALIAS FOR p_window_us{{end}};
{{- template "locals"}}
BEGIN
	IF p_op = {{op "take"}} AND (cost < 1 OR cost > quota) THEN
		RAISE EXCEPTION 'ratekit: cost % is outside 1..%', cost, quota USING ERRCODE = '22023';
	END IF;
	IF p_op <> {{op "peek"}} AND NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	IF p_op = {{op "peek"}} THEN
{{- if eq .Alg "sliding_log"}}
		now_us := {{template "clock"}};
		SELECT COALESCE(sum(l.cost), 0), COALESCE(max(l.expires_at_us), 0) INTO used, last_expiry
		FROM {{.Log}} AS l WHERE l.prefix = policy_prefix AND l.key = policy_key AND l.expires_at_us + 0 > now_us;
{{- else}}
		-- A peek locks nothing: it reads the clock after the state, so
		-- every decision it sees read its clock no later.
		SELECT c.window_start_us, c.count, c.prev_count, c.tat_us INTO window_start, used, prev_used, tat
		FROM {{.Counters}} AS c WHERE c.prefix = policy_prefix AND c.key = policy_key;
		IF NOT FOUND THEN
			window_start := 0; used := 0; prev_used := 0; tat := 0;
		END IF;
		now_us := {{template "clock"}};
{{- end}}
	ELSE
{{- if eq .Alg "sliding_log"}}
		PERFORM pg_advisory_xact_lock(p_lock);
{{- else}}
{{include "lockrow" . | indent 1}}
{{- end}}
		now_us := {{template "clock"}};
{{include "remember" . | indent 1}}
	END IF;
{{include (print .Alg ".roll") .}}
	IF p_op = {{op "take"}} AND NOT duplicate THEN
		allowed := admits;
		IF allowed THEN
{{include (print .Alg ".take") . | indent 2}}
		END IF;
	ELSIF p_op = {{op "refund"}} AND NOT duplicate THEN
{{include (print .Alg ".refund") . | indent 1}}
		allowed := true;
	ELSE
		allowed := admits OR duplicate;
	END IF;
{{include (print .Alg ".report") .}}
{{template "forget" .}}
	IF p_cleanup > 0 THEN
		-- Only rows that expired more than one window (p_idem_ttl_us) ago:
		-- the row of a key in use is updated in place rather than deleted
		-- and created again at every window.
		PERFORM {{.Cleanup}}(p_prefix, now_us - p_idem_ttl_us, p_cleanup);
	END IF;
	RETURN ARRAY[allowed::int, remaining, retry_after_us, reset_after_us, duplicate::int];
END
$fn$;
{{end}}

{{- /* The locals of a decision, beside a policy's quota, cost, window_us or
interval_us, policy_prefix and policy_key. */ -}}
{{define "locals"}}
	now_us bigint;
	row_id tid; -- the key's counter row as locked, written by its ctid
	window_start bigint; -- the start of the window (or period) the row counts
	used bigint; -- units counted in that window, or in the log
	prev_used bigint; -- units counted in the window before it
	tat bigint; -- the token bucket's theoretical arrival time
	last_expiry bigint; -- the latest expiry of a log entry
	read_start bigint; -- a period row's start, count and end as read,
	read_used bigint; -- before it was rolled forward
	read_expiry bigint;
	aligned_start bigint; -- the start of the aligned window that holds now
	period_start bigint;
	period_end bigint;
	elapsed_us bigint;
	room numeric;
	units_left bigint;
	free_at bigint;
	entry record;
	admits boolean; -- whether the policy has room for the cost
	allowed boolean;
	duplicate boolean := false;
	remaining bigint;
	retry_after_us bigint;
	reset_after_us bigint;
{{- end}}

{{- /* The composite's pass over policy i starts by loading its arguments and
state into the locals. */ -}}
{{define "load"}}		quota := p_quotas[i]; cost := p_costs[i]; window_us := p_windows[i]; interval_us := window_us;
		policy_prefix := p_prefixes[i]; policy_key := p_keys[i];
		window_start := starts[i]; used := useds[i]; prev_used := prev_useds[i]; tat := tats[i];
		last_expiry := last_expiries[i];{{end}}

{{- /* One phase of every algorithm, as the arms of a CASE on policy i's
algorithm: an unknown code raises CASE_NOT_FOUND. */ -}}
{{define "arms"}}CASE p_algs[i]
{{- range .Algorithms}}
WHEN {{alg .}} THEN
{{include (print . "." $.Phase) $}}
{{- end}}
END CASE;{{end}}

{{- /* Lock the key's row and read it, then read the clock (by the caller):
a decision that waited for the lock never sees a state written by a
decision with a later clock. A take creates a missing row in a state that
means the same as no row (every time 0), so that concurrent first takes
queue on it too; so does a refund of a composite or with an idempotency
key, so that every transaction touches a key's idempotency records only
while it holds the key's lock (two that locked two records in opposite
orders would deadlock). A row neither found nor created reads as zeros. */ -}}
{{define "lockrow"}}	LOOP
		SELECT c.ctid, c.window_start_us, c.count, c.prev_count, c.tat_us, c.expires_at_us
		INTO row_id, window_start, used, prev_used, tat, read_expiry
		FROM {{.Counters}} AS c WHERE c.prefix = policy_prefix AND c.key = policy_key FOR UPDATE;
		EXIT WHEN FOUND{{if not .InComposite}} OR p_op <> {{op "take"}} AND p_idem IS NULL{{end}};
		INSERT INTO {{.Counters}} AS c (prefix, key, expires_at_us) VALUES (policy_prefix, policy_key, 0)
		ON CONFLICT (prefix, key) DO NOTHING
		RETURNING c.ctid, c.window_start_us, c.count, c.prev_count, c.tat_us, c.expires_at_us
		INTO row_id, window_start, used, prev_used, tat, read_expiry;
		EXIT WHEN FOUND;
	END LOOP;
	IF row_id IS NULL THEN
		window_start := 0; used := 0; prev_used := 0; tat := 0; read_expiry := 0;
	END IF;{{end}}

{{- /* Record the idempotency key of a take or refund; duplicate when a live
record exists. */ -}}
{{define "remember"}}	IF p_op <> {{op "peek"}} AND p_idem IS NOT NULL THEN
		INSERT INTO {{.Idem}} AS x (prefix, key, idempotency_key, expires_at_us)
		VALUES ({{.IdemPrefix}}, {{.IdemKey}}, p_idem, now_us + p_idem_ttl_us)
		ON CONFLICT (prefix, key, idempotency_key) DO UPDATE SET expires_at_us = EXCLUDED.expires_at_us
		WHERE x.expires_at_us <= now_us;
		duplicate := NOT FOUND;
	END IF;{{end}}

{{- /* After the decision: a denied take consumed nothing, so its
idempotency record goes and a retry is judged afresh. A fresh take or
refund ends the other operation's record for the same idempotency key (the
records differ in their first byte, the tag): a retry after a refunded
failure is charged again, and a refund after that charge is not taken for
a duplicate. */ -}}
{{define "forget"}}	IF p_op = {{op "take"}} AND p_idem IS NOT NULL AND NOT duplicate AND NOT {{.Admitted}} THEN
		DELETE FROM {{.Idem}} AS x WHERE x.prefix = {{.IdemPrefix}} AND x.key = {{.IdemKey}} AND x.idempotency_key = p_idem;
	ELSIF p_op <> {{op "peek"}} AND p_idem IS NOT NULL AND NOT duplicate THEN
		DELETE FROM {{.Idem}} AS x WHERE x.prefix = {{.IdemPrefix}} AND x.key = {{.IdemKey}}
			AND x.idempotency_key = set_byte(p_idem, 0,
				CASE WHEN p_op = {{op "take"}} THEN {{tag (print .TagPrefix "refund")}} ELSE {{tag (print .TagPrefix "take")}} END);
	END IF;{{end}}

{{- /* Fixed window: windows aligned to the epoch. */ -}}
{{define "fixed_window.roll"}}	aligned_start := {{template "fixed_window.aligned" (locals "fixed_window")}};
{{template "fixed_window.count"}}{{end}}
{{define "fixed_window.count"}}{{$s := locals "fixed_window"}}	-- A row of an earlier window counts from zero.
	admits := {{template "fixed_window.admits" $s}};
	used := {{template "fixed_window.used" $s}};
	window_start := {{template "fixed_window.start" $s}};{{end}}
{{define "fixed_window.take"}}	used := used + cost;
	UPDATE {{.Counters}} AS c SET window_start_us = window_start, count = used,
		expires_at_us = {{template "fixed_window.expiry" (locals "fixed_window" "Expiry" "c.expires_at_us")}}
	WHERE c.ctid = row_id;{{end}}
{{define "fixed_window.refund"}}	IF used > 0 THEN
		used := GREATEST(used - cost, 0);
		UPDATE {{.Counters}} AS c SET count = used WHERE c.ctid = row_id;
	END IF;{{end}}
{{define "fixed_window.report"}}{{$s := locals "fixed_window"}}	remaining := {{template "fixed_window.remaining" $s}};
	reset_after_us := {{template "fixed_window.reset" $s}};
	retry_after_us := CASE WHEN allowed THEN 0 ELSE reset_after_us END;{{end}}
{{- /* The fixed window's rules as expressions of a state (Start, Used,
Expiry: a row's window_start_us, count and expires_at_us), the clock (Now,
and Aligned, the start of the window that holds it) and the policy (Cost,
Quota, Span: the window), which the blocks above run on a decision's
locals and the take statement on a row. */}}
{{- define "fixed_window.aligned"}}{{.Now}} - {{.Now}} % {{.Span}}{{end}}
{{- define "fixed_window.used"}}CASE WHEN {{.Start}} < {{.Aligned}} THEN 0 ELSE {{.Used}} END{{end}}
{{- define "fixed_window.admits"}}{{template "fixed_window.used" .}} + {{.Cost}} <= {{.Quota}}{{end}}
{{- define "fixed_window.start"}}GREATEST({{.Start}}, {{.Aligned}}){{end}}
{{- define "fixed_window.expiry"}}GREATEST({{.Expiry}}, {{.Start}} + {{.Span}}){{end}}
{{- define "fixed_window.remaining"}}GREATEST({{.Quota}} - {{.Used}}, 0){{end}}
{{- define "fixed_window.reset"}}GREATEST({{.Start}} + {{.Span}} - {{.Now}}, 0){{end}}
{{- /* The take statement's parts: the state a take leaves, for the row a
missing key gets (fresh: no state, the clock read before the insert) and
for the row found (row: the clock read after its lock), and what it
returns (result): remaining and reset after. */}}
{{- define "fixed_window.fresh"}}
{{- $a := include "fixed_window.aligned" (statement "Now" "f.now_us")}}window_start_us, count, expires_at_us)
	SELECT $1, $2, {{$a}}, $3::bigint, {{$a}} + $5::bigint{{end}}
{{- define "fixed_window.row"}}
{{- $a := "(SELECT k.aligned_start FROM lock_clock AS k)"}}
{{- $s := statement "Start" "c.window_start_us" "Used" "c.count" "Aligned" $a}}
{{- $t := statement "Start" (include "fixed_window.start" $s) "Expiry" "c.expires_at_us"}}window_start_us = {{template "fixed_window.start" $s}},
		count = {{template "fixed_window.used" $s}} + $3::bigint,
		expires_at_us = {{template "fixed_window.expiry" $t}}
	WHERE {{template "fixed_window.admits" $s}}{{end}}
{{- define "fixed_window.result"}}
{{- $s := statement "Start" "c.window_start_us" "Used" "c.count" "Now" "LEAST((SELECT k.now_us FROM lock_clock AS k), c.window_start_us + $5::bigint - 1)"}}{{template "fixed_window.remaining" $s}}, {{template "fixed_window.reset" $s}}{{end}}
{{- define "fixed_window.lock_clock"}}SELECT r.now_us, {{template "fixed_window.aligned" (statement "Now" "r.now_us")}} AS aligned_start
		FROM (SELECT {{template "clock"}} AS now_us) AS r{{end}}

{{- /* The set-based take's parts (see "many"): the state a key's total
leaves, whether it fits, and what a decision reports of the state its own
take left (the row t as updated, less the costs after it, x.after). */}}
{{- define "fixed_window.many_set"}}
{{- $s := many "Start" "c.window_start_us" "Used" "c.count" "Aligned" (include "fixed_window.aligned" (many))}}
{{- $t := many "Start" (include "fixed_window.start" $s) "Expiry" "c.expires_at_us"}}window_start_us = {{template "fixed_window.start" $s}},
			count = {{template "fixed_window.used" $s}} + g.total,
			expires_at_us = {{template "fixed_window.expiry" $t}}{{end}}
{{- define "fixed_window.many_admits"}}{{template "fixed_window.admits" (many "Start" "c.window_start_us" "Used" "c.count" "Aligned" (include "fixed_window.aligned" (many)))}}{{end}}
{{- define "fixed_window.many_result"}}{{$s := many "Start" "t.window_start_us" "Used" "(t.count - x.after)"}}{{template "fixed_window.remaining" $s}}, 0, {{template "fixed_window.reset" $s}}{{end}}

{{- /* Period: a fixed window over the calendar periods the client sent
(composite only; see the composite function). */ -}}
{{define "period.roll"}}	j := 4 * (i - 1);
	IF now_us >= p_bounds[j + 1] AND now_us < p_bounds[j + 2] THEN
		period_start := p_bounds[j + 1]; period_end := p_bounds[j + 2];
	ELSIF now_us >= p_bounds[j + 2] AND now_us < p_bounds[j + 3] THEN
		period_start := p_bounds[j + 2]; period_end := p_bounds[j + 3];
	ELSIF now_us >= p_bounds[j + 3] AND now_us < p_bounds[j + 4] THEN
		period_start := p_bounds[j + 3]; period_end := p_bounds[j + 4];
	ELSE
		RAISE EXCEPTION 'ratekit: clock skew: the database clock (% µs since the Unix epoch) is outside the periods [%, %) that the client computed for policy %: the clocks differ by more than a period',
			now_us, p_bounds[j + 1], p_bounds[j + 4], policy_prefix USING ERRCODE = 'RK001';
	END IF;
	read_start := window_start; read_used := used;
	-- A row whose period started later (the key's anchor moved back) keeps
	-- its count: a change of period never grants a fresh one.
	aligned_start := period_start;
{{template "fixed_window.count"}}
	-- Kept for the composite's second pass, which the other algorithms
	-- need not.
	period_starts[i] := period_start; period_ends[i] := period_end;
	read_starts[i] := read_start; read_useds[i] := read_used;{{end}}
{{define "period.take"}}	used := used + cost;
	IF read_start < window_start AND read_used > 0 THEN
		INSERT INTO {{.Usage}} AS u (prefix, key, period_start_us, period_end_us, used)
		VALUES (policy_prefix, policy_key, read_start, read_expiry, read_used)
		ON CONFLICT (prefix, period_start_us, key) DO UPDATE SET used = u.used + EXCLUDED.used,
			period_end_us = GREATEST(u.period_end_us, EXCLUDED.period_end_us);
	END IF;
	UPDATE {{.Counters}} AS c SET window_start_us = window_start, count = used,
		expires_at_us = GREATEST(c.expires_at_us, period_end)
	WHERE c.ctid = row_id;{{end}}
{{define "period.refund"}}	IF used > 0 AND (charged_at IS NULL OR charged_at >= window_start) THEN
		used := GREATEST(used - cost, 0);
		UPDATE {{.Counters}} AS c SET count = used WHERE c.ctid = row_id;
	END IF;{{end}}
{{define "period.report"}}	remaining := GREATEST(quota - used, 0);
	reset_after_us := GREATEST(period_end - now_us, 0);
	retry_after_us := CASE WHEN allowed THEN 0 ELSE reset_after_us END;{{end}}

{{- /* Sliding window: the units of the previous aligned window weigh by the
part of the rolling window that still overlaps it. */ -}}
{{define "sliding_window.roll"}}	aligned_start := now_us - now_us % window_us;
	IF window_start < aligned_start THEN
		prev_used := CASE WHEN window_start = aligned_start - window_us THEN used ELSE 0 END;
		used := 0;
		window_start := aligned_start;
	END IF;
{{template "sliding_window.room"}}
	admits := room >= cost::numeric * window_us;{{end}}
{{define "sliding_window.room"}}	-- room is (quota - estimate) * window, exact in numeric.
	elapsed_us := GREATEST(now_us - window_start, 0);
	room := quota::numeric * window_us - prev_used::numeric * (window_us - elapsed_us) - used::numeric * window_us;{{end}}
{{define "sliding_window.take"}}	used := used + cost;
	UPDATE {{.Counters}} AS c SET window_start_us = window_start, count = used, prev_count = prev_used,
		expires_at_us = GREATEST(c.expires_at_us, window_start + 2 * window_us)
	WHERE c.ctid = row_id;{{end}}
{{define "sliding_window.refund"}}	IF used > 0 OR prev_used > 0 THEN
		-- The current window first, then the previous one.
		prev_used := GREATEST(prev_used - GREATEST(cost - used, 0), 0);
		used := GREATEST(used - cost, 0);
		UPDATE {{.Counters}} AS c SET window_start_us = window_start, count = used, prev_count = prev_used
		WHERE c.ctid = row_id;
	END IF;{{end}}
{{define "sliding_window.report"}}{{template "sliding_window.room"}}
	remaining := GREATEST(div(room, window_us), 0)::bigint;
	reset_after_us := CASE
		WHEN used > 0 THEN window_start + 2 * window_us - now_us
		WHEN prev_used > 0 THEN window_start + window_us - now_us
		ELSE 0 END;
	IF allowed THEN
		retry_after_us := 0;
	ELSIF used + cost <= quota THEN
		-- Wait until the previous window's weight has decayed enough:
		-- prev_used * (window - x) / window <= quota - used - cost.
		retry_after_us := GREATEST(ceil(window_us - (quota - used - cost)::numeric * window_us / prev_used)::bigint - elapsed_us, 1);
	ELSE
		-- Wait for the next window, where this window's count becomes the
		-- previous one: used * (window - x) / window <= quota - cost.
		retry_after_us := (window_start + window_us - now_us)
			+ GREATEST(ceil(window_us - (quota - cost)::numeric * window_us / used)::bigint, 0);
	END IF;{{end}}

{{- /* Token bucket (GCRA): quota * interval_us is the burst offset, the
furthest the theoretical arrival time may run ahead of now. */ -}}
{{define "token_bucket.roll"}}{{$s := locals "token_bucket"}}	admits := {{template "token_bucket.admits" $s}};
	tat := {{template "token_bucket.due" $s}};{{end}}
{{define "token_bucket.take"}}	tat := {{template "token_bucket.next" (locals "token_bucket")}};
	UPDATE {{.Counters}} AS c SET tat_us = tat,
		expires_at_us = {{template "token_bucket.expiry" (locals "token_bucket" "Expiry" "c.expires_at_us")}}
	WHERE c.ctid = row_id;{{end}}
{{define "token_bucket.refund"}}	IF tat > now_us THEN
		tat := GREATEST(tat - cost * interval_us, now_us);
		UPDATE {{.Counters}} AS c SET tat_us = tat WHERE c.ctid = row_id;
	END IF;{{end}}
{{define "token_bucket.report"}}{{$s := locals "token_bucket"}}	remaining := {{template "token_bucket.remaining" $s}};
	reset_after_us := {{template "token_bucket.reset" $s}};
	retry_after_us := CASE WHEN allowed THEN 0 ELSE GREATEST(tat + cost * interval_us - quota * interval_us - now_us, 1) END;{{end}}
{{- /* The token bucket's rules as expressions of a state (Tat, Expiry: a
row's tat_us and expires_at_us), the clock (Now) and the policy (Cost,
Quota, Span: the emission interval), which the blocks above run on a
decision's locals and the take statement on a row. */}}
{{- define "token_bucket.due"}}GREATEST({{.Tat}}, {{.Now}}){{end}}
{{- /* admits reads the clock once: due - Now is GREATEST(Tat - Now, 0). In
the take statement each reading of lock_clock is a sub-plan of its own. */}}
{{- define "token_bucket.admits"}}GREATEST({{.Tat}} - {{.Now}}, 0) + {{.Cost}} * {{.Span}} <= {{.Quota}} * {{.Span}}{{end}}
{{- define "token_bucket.next"}}{{template "token_bucket.due" .}} + {{.Cost}} * {{.Span}}{{end}}
{{- /* The expiry is the new tat (Tat) rounded up to a multiple of the burst
offset, so that it changes about once per burst offset and most updates
stay HOT. */}}
{{- define "token_bucket.expiry"}}GREATEST({{.Expiry}}, ({{.Tat}} / ({{.Quota}} * {{.Span}}) + 1) * ({{.Quota}} * {{.Span}})){{end}}
{{- define "token_bucket.remaining"}}GREATEST(({{.Quota}} * {{.Span}} - ({{.Tat}} - {{.Now}})) / {{.Span}}, 0){{end}}
{{- define "token_bucket.reset"}}{{.Tat}} - {{.Now}}{{end}}
{{- /* The take statement's parts, as the fixed window's; its result is the
reset after alone, from which the client derives remaining as
token_bucket.remaining does (Tat - Now is the reset after): reading the
clock once more would cost the server more than the division costs the
client. */}}
{{- define "token_bucket.fresh"}}
{{- $next := "(f.now_us + $3::bigint * $5::bigint)"}}tat_us, expires_at_us)
	SELECT $1, $2, {{$next}}, {{template "token_bucket.expiry" (statement "Tat" $next "Expiry" "0")}}{{end}}
{{- define "token_bucket.row"}}
{{- $s := statement "Tat" "c.tat_us" "Now" "(SELECT k.now_us FROM lock_clock AS k)"}}
{{- $next := print "(" (include "token_bucket.next" $s) ")"}}tat_us = {{$next}},
		expires_at_us = {{template "token_bucket.expiry" (statement "Tat" $next "Expiry" "c.expires_at_us")}}
	WHERE {{template "token_bucket.admits" $s}}{{end}}
{{- define "token_bucket.result"}}
{{- $s := statement "Tat" "c.tat_us" "Now" "LEAST((SELECT k.now_us FROM lock_clock AS k), c.tat_us - $3::bigint * $5::bigint)"}}{{template "token_bucket.reset" $s}}{{end}}
{{- define "token_bucket.lock_clock"}}SELECT {{template "clock"}} AS now_us{{end}}

{{- define "token_bucket.many_set"}}
{{- $next := print "(" (include "token_bucket.next" (many "Tat" "c.tat_us")) ")"}}tat_us = {{$next}},
			expires_at_us = {{template "token_bucket.expiry" (many "Tat" $next "Expiry" "c.expires_at_us")}}{{end}}
{{- define "token_bucket.many_admits"}}{{template "token_bucket.admits" (many "Tat" "c.tat_us")}}{{end}}
{{- define "token_bucket.many_result"}}{{$s := many "Tat" "(t.tat_us - x.after * p_span)"}}{{template "token_bucket.remaining" $s}}, 0, {{template "token_bucket.reset" $s}}{{end}}

{{- /* The take statement of a counter of an algorithm on a table: a lone
take without an idempotency key or cleanup, in one upsert instead of a
function call, which saves the server a good part of a decision's work.
A missing row is inserted as a take on a fresh key leaves it, on the
clock read before the insert (f, a subquery that OFFSET 0 keeps from
being folded into the expressions that read it): there is no lock to
wait for and no state to be late for. A row found is locked first (ON
CONFLICT DO UPDATE locks it even when its WHERE refuses), and lock_clock
reads the clock where an expression first reads it, in the WHERE, after
the lock; SET reads that reading. Each expression that reads lock_clock
is a sub-plan the server sets up on every call, so the rules read it as
few times as they can. An admitted take returns what the function would
report, as of the clock it was decided on, in bigints ("<alg>.result"):
RETURNING reads lock_clock (for an inserted row, only then) bounded by
what the row shows (a bucket's tat less the cost is that clock for a
fresh key and no earlier than it for a row found; a window ends after
it). A refused take returns no row and has written nothing; the client
decides it afresh with the function. $1 prefix, $2 key, $3 cost, $4
quota, $5 window or emission interval (µs); Sync false turns
synchronous_commit off for the transaction, as the function's p_sync
does. */}}
{{- define "take"}}WITH lock_clock AS MATERIALIZED ({{include (print .Alg ".lock_clock") .}}){{if not .Sync}},
	sync_off AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)){{end}}
INSERT INTO {{.Counters}} AS c (prefix, key, {{include (print .Alg ".fresh") .}}
	FROM (SELECT {{template "clock"}} AS now_us OFFSET 0) AS f{{if not .Sync}}, sync_off{{end}}
ON CONFLICT (prefix, key) DO UPDATE SET {{include (print .Alg ".row") .}}
RETURNING {{include (print .Alg ".result") .}}{{end}}

{{- /* The set-based take of a counter of an algorithm on a table: the plain
takes of a batch (no idempotency key or cleanup) of one counter, on one key
or many, in one call, which costs the server a fraction of a statement or a
function call per decision. The client sends the batch's keys in the lock
order (byte order), each once, with the total cost of its decisions
(p_totals), and for each decision in the batch's order its key (p_at, an
index into p_keys) and the cost of the key's decisions after it in the
batch (p_after). The call locks every key's row in the lock order. A key
with no row yet (its first take) gets an empty one, which reads as a fresh
key: inserted after the rows found, which may come after it in the lock
order, so the insert waits at most 10 ms for another transaction
that is inserting the same key (which may be waiting for a row this call
holds) and leaves the keys it would insert without a row when it would wait
longer. The call then reads the clock once, so that no decision sees a
state written with a later clock, and takes each key's total in one update
when the total fits, as its decisions one after another would. It returns,
per decision, remaining, retry after (0) and reset after (µs) of the state
its own take left; or -1, -1, -1 when its key has no row or its key's total
does not fit: nothing was written for that key, and the client has the
batch function decide those decisions afresh. */ -}}
{{define "many"}}
-- The set-based take of {{.Alg}} (see the batch function): one counter's
-- plain takes on keys p_keys, each once, in byte order.
DROP FUNCTION IF EXISTS {{.Many}}(text, bytea[], bigint[], int[], bigint[], bigint, bigint, boolean);
CREATE OR REPLACE FUNCTION {{.Many}}(
	p_prefix text, p_keys bytea[], p_totals bigint[], p_at int[], p_after bigint[], p_quota bigint, p_span bigint,
	p_sync boolean)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
	n int := cardinality(p_keys);
	now_us bigint;
	ids tid[]; -- the rows locked, as locked
	wait text;
	res bigint[];
BEGIN
	IF n IS NULL OR n < 1 OR cardinality(p_totals) IS DISTINCT FROM n OR cardinality(p_at) IS NULL
		OR cardinality(p_after) IS DISTINCT FROM cardinality(p_at) OR p_quota IS NULL OR p_quota < 1
		OR p_span IS NULL OR p_span < 1 OR p_sync IS NULL
		OR (SELECT count(DISTINCT g.key) <> n OR bool_or(g.key IS NULL OR g.total IS NULL OR g.total < 1)
			FROM unnest(p_keys, p_totals) AS g(key, total))
		OR (SELECT bool_or(x.at IS NULL OR x.at < 1 OR x.at > n OR x.after IS NULL OR x.after < 0
			OR x.after >= p_totals[x.at]) FROM unnest(p_at, p_after) AS x(at, after)) THEN
		RAISE EXCEPTION 'ratekit: set-based take arguments are invalid' USING ERRCODE = '22023';
	END IF;
	IF NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	-- Lock the rows one key at a time in the lock order, each found
	-- through the primary key and updated by its ctid: a plan kept from
	-- when the table was small must not scan a prefix's rows.
	SELECT array_agg(l.id) INTO ids
	FROM (SELECT u.key FROM unnest(p_keys) AS u(key) ORDER BY u.key OFFSET 0) AS k
	CROSS JOIN LATERAL (SELECT c.ctid AS id FROM {{.Counters}} AS c
		WHERE c.prefix = p_prefix AND c.key = k.key FOR UPDATE) AS l;
	IF cardinality(ids) IS DISTINCT FROM n THEN
		-- Empty rows for the keys without one, in the lock order (the
		-- rows locked here conflict, and DO NOTHING neither waits for
		-- them nor returns them). This call holds rows that may come
		-- after the new keys in that order, so it must not wait long for
		-- a transaction inserting one of them: that one may be waiting
		-- for a row held here.
		wait := current_setting('lock_timeout');
		PERFORM set_config('lock_timeout', '10ms', true);
		BEGIN
			WITH made AS (
				INSERT INTO {{.Counters}} AS c (prefix, key, expires_at_us)
				SELECT p_prefix, g.key, 0 FROM unnest(p_keys, p_totals) AS g(key, total)
				WHERE g.total <= p_quota
				ORDER BY g.key
				ON CONFLICT (prefix, key) DO NOTHING
				RETURNING c.ctid
			)
			SELECT COALESCE(ids, '{}') || COALESCE(array_agg(made.ctid), '{}') INTO ids FROM made;
		EXCEPTION WHEN lock_not_available THEN
			NULL; -- inserted by another transaction meanwhile: refused here
		END;
		PERFORM set_config('lock_timeout', wait, true);
	END IF;
	now_us := {{template "clock"}};
	WITH t AS (
		UPDATE {{.Counters}} AS c SET {{include (print .Alg ".many_set") .}}
		FROM unnest(p_keys, p_totals) AS g(key, total)
		WHERE c.ctid = ANY (ids) AND c.key = g.key AND {{include (print .Alg ".many_admits") .}}
		RETURNING c.key, c.window_start_us, c.count, c.tat_us
	)
	SELECT array_agg(r.v ORDER BY x.ord, r.j) INTO res
	FROM unnest(p_at, p_after) WITH ORDINALITY AS x(at, after, ord)
	LEFT JOIN t ON t.key = p_keys[x.at]
	CROSS JOIN LATERAL unnest(CASE WHEN t.key IS NULL THEN ARRAY[-1, -1, -1]::bigint[]
		ELSE ARRAY[{{include (print .Alg ".many_result") .}}] END) WITH ORDINALITY AS r(v, j);
	RETURN res;
END
$fn$;
{{end}}

{{- /* Sliding log: the units of the log entries that have not expired.
Per-key conditions on expires_at_us are written "+ 0" so that the planner
cannot use the (prefix, expires_at_us) cleanup index for them: on a fresh
table without statistics it otherwise prefers that index and scans every
row of the prefix. A peek has read the log already. */ -}}
{{define "sliding_log.roll"}}	IF p_op <> {{op "peek"}} THEN
		DELETE FROM {{.Log}} AS l WHERE l.prefix = policy_prefix AND l.key = policy_key AND l.expires_at_us + 0 <= now_us;
		SELECT COALESCE(sum(l.cost), 0), COALESCE(max(l.expires_at_us), 0) INTO used, last_expiry
		FROM {{.Log}} AS l WHERE l.prefix = policy_prefix AND l.key = policy_key AND l.expires_at_us + 0 > now_us;
	END IF;
	admits := used + cost <= quota;{{end}}
{{define "sliding_log.take"}}	INSERT INTO {{.Log}} (prefix, key, at_us, cost, expires_at_us)
	VALUES (policy_prefix, policy_key, now_us, cost, now_us + window_us);
	used := used + cost;
	last_expiry := now_us + window_us;{{end}}
{{define "sliding_log.refund"}}	-- Give back the most recent admissions first.
	units_left := cost;
	FOR entry IN SELECT l.ctid AS id, l.cost FROM {{.Log}} AS l
		WHERE l.prefix = policy_prefix AND l.key = policy_key AND l.expires_at_us + 0 > now_us
		ORDER BY l.at_us DESC LOOP
		EXIT WHEN units_left = 0;
		IF entry.cost <= units_left THEN
			DELETE FROM {{.Log}} AS l WHERE l.ctid = entry.id;
			units_left := units_left - entry.cost;
			used := used - entry.cost;
		ELSE
			UPDATE {{.Log}} AS l SET cost = l.cost - units_left WHERE l.ctid = entry.id;
			used := used - units_left;
			units_left := 0;
		END IF;
	END LOOP;{{end}}
{{define "sliding_log.report"}}	remaining := GREATEST(quota - used, 0);
	reset_after_us := CASE WHEN used > 0 THEN GREATEST(last_expiry - now_us, 0) ELSE 0 END;
	IF allowed THEN
		retry_after_us := 0;
	ELSE
		-- The earliest expiry after which enough units have left the window.
		free_at := NULL;
		SELECT x.expires_at_us INTO free_at FROM (
			SELECT l.expires_at_us, sum(l.cost) OVER (ORDER BY l.expires_at_us, l.at_us ROWS UNBOUNDED PRECEDING) AS freed
			FROM {{.Log}} AS l WHERE l.prefix = policy_prefix AND l.key = policy_key AND l.expires_at_us + 0 > now_us
		) AS x WHERE used - x.freed + cost <= quota ORDER BY x.expires_at_us LIMIT 1;
		retry_after_us := GREATEST(COALESCE(free_at, last_expiry) - now_us, 1);
	END IF;{{end}}
{{define "clock"}}(extract(epoch FROM clock_timestamp()) * 1000000)::bigint{{end}}
{{define "args"}}bigint, text, bytea, bigint, bigint, bigint, bigint, bytea, bigint, bigint, boolean{{end}}
