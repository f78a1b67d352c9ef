-- ratekit pgstore schema, version 15.
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
CREATE SCHEMA IF NOT EXISTS "{{SCHEMA}}";

CREATE UNLOGGED TABLE IF NOT EXISTS "{{SCHEMA}}".counters_unlogged (
	prefix          text   NOT NULL,
	key             bytea  NOT NULL,
	window_start_us bigint NOT NULL DEFAULT 0,
	count           bigint NOT NULL DEFAULT 0,
	prev_count      bigint NOT NULL DEFAULT 0,
	tat_us          bigint NOT NULL DEFAULT 0,
	expires_at_us   bigint NOT NULL,
	PRIMARY KEY (prefix, key)
) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS counters_unlogged_expiry ON "{{SCHEMA}}".counters_unlogged (prefix, expires_at_us);

CREATE UNLOGGED TABLE IF NOT EXISTS "{{SCHEMA}}".log_unlogged (
	prefix        text   NOT NULL,
	key           bytea  NOT NULL,
	at_us         bigint NOT NULL,
	cost          bigint NOT NULL,
	expires_at_us bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS log_unlogged_key ON "{{SCHEMA}}".log_unlogged (prefix, key, expires_at_us);
CREATE INDEX IF NOT EXISTS log_unlogged_expiry ON "{{SCHEMA}}".log_unlogged (prefix, expires_at_us);

CREATE UNLOGGED TABLE IF NOT EXISTS "{{SCHEMA}}".idempotency_unlogged (
	prefix          text   NOT NULL,
	key             bytea  NOT NULL,
	idempotency_key bytea  NOT NULL,
	expires_at_us   bigint NOT NULL,
	PRIMARY KEY (prefix, key, idempotency_key)
);
CREATE INDEX IF NOT EXISTS idempotency_unlogged_expiry ON "{{SCHEMA}}".idempotency_unlogged (prefix, expires_at_us);

-- The units each key used in each ended period of a calendar-period policy
-- (composite algorithm 5), moved here from the counter row, in the
-- transaction that starts the key's next period: a period's usage is in
-- the counter row while it is the row's period and here after, never in
-- both, so one statement that reads both is exact. Nothing deletes these
-- rows: they are billing records.
CREATE UNLOGGED TABLE IF NOT EXISTS "{{SCHEMA}}".period_usage_unlogged (
	prefix          text   NOT NULL,
	key             bytea  NOT NULL,
	period_start_us bigint NOT NULL,
	period_end_us   bigint NOT NULL,
	used            bigint NOT NULL,
	PRIMARY KEY (prefix, period_start_us, key)
);

-- Cleanup: delete up to p_quota rows of each table under p_prefix that
-- expired before p_before, skipping rows locked by others, and return how
-- many of each (counters, log entries, idempotency records), found through
-- the expiry indexes (see enable_seqscan above).
DROP FUNCTION IF EXISTS "{{SCHEMA}}".cleanup_unlogged(text, bigint, bigint);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".cleanup_unlogged(p_prefix text, p_before bigint, p_quota bigint)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	a bigint;
	b bigint;
	c bigint;
BEGIN
	DELETE FROM "{{SCHEMA}}".counters_unlogged AS x WHERE x.ctid = ANY (ARRAY(
		SELECT e.ctid FROM "{{SCHEMA}}".counters_unlogged AS e WHERE e.prefix = p_prefix AND e.expires_at_us < p_before
		LIMIT p_quota FOR UPDATE SKIP LOCKED));
	GET DIAGNOSTICS a = ROW_COUNT;
	DELETE FROM "{{SCHEMA}}".log_unlogged AS x WHERE x.ctid = ANY (ARRAY(
		SELECT e.ctid FROM "{{SCHEMA}}".log_unlogged AS e WHERE e.prefix = p_prefix AND e.expires_at_us < p_before
		LIMIT p_quota FOR UPDATE SKIP LOCKED));
	GET DIAGNOSTICS b = ROW_COUNT;
	DELETE FROM "{{SCHEMA}}".idempotency_unlogged AS x WHERE x.ctid = ANY (ARRAY(
		SELECT e.ctid FROM "{{SCHEMA}}".idempotency_unlogged AS e WHERE e.prefix = p_prefix AND e.expires_at_us < p_before
		LIMIT p_quota FOR UPDATE SKIP LOCKED));
	GET DIAGNOSTICS c = ROW_COUNT;
	RETURN ARRAY[a, b, c];
END
$fn$;

-- Fixed window: windows aligned to the epoch; count is the units taken in
-- the window that starts at window_start_us. A take decides on the state
-- that lockrow read under the lock and writes the row by its ctid only when
-- it admits: no upsert after the lock, and no second look-up of the key.
DROP FUNCTION IF EXISTS "{{SCHEMA}}".fixed_window_unlogged(bigint, text, bytea, bigint, bigint, bigint, bigint, bytea, bigint, bigint, boolean);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".fixed_window_unlogged(
	p_op bigint, p_prefix text, p_key bytea, p_cost bigint, p_quota bigint, p_window_us bigint,
	p_lock bigint, p_idem bytea, p_idem_ttl_us bigint, p_cleanup bigint, p_sync boolean)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	allowed boolean;
	remaining bigint;
	retry_after_us bigint;
	reset_after_us bigint;
	duplicate boolean;
	l_id tid;
	l_ws bigint;
	l_count bigint;
	l_prev bigint;
	l_tat bigint;
	now_us bigint;
	ws bigint;
	v_ws bigint;
	v_count bigint;
	v_found boolean := false;
BEGIN
	-- Lock the key's row first and read the clock only then, so that a
	-- decision that waited for the lock never sees a state written by a
	-- decision with a later clock. A take creates a missing row in a state
	-- that means the same as no row (every time 0), so that concurrent
	-- first takes queue on it too; so does a refund with an idempotency
	-- key, so that every transaction touches a key's idempotency records
	-- only while it holds the key's lock (two that locked two records in
	-- opposite orders would deadlock). The row's ctid and state as locked
	-- go to l_id, l_ws, l_count, l_prev and l_tat, for a take to decide on.
	IF p_op <> 1 THEN
		LOOP
			SELECT c.ctid, c.window_start_us, c.count, c.prev_count, c.tat_us INTO l_id, l_ws, l_count, l_prev, l_tat
			FROM "{{SCHEMA}}".counters_unlogged AS c WHERE c.prefix = p_prefix AND c.key = p_key FOR UPDATE;
			EXIT WHEN FOUND OR p_op <> 0 AND p_idem IS NULL;
			INSERT INTO "{{SCHEMA}}".counters_unlogged (prefix, key, expires_at_us) VALUES (p_prefix, p_key, 0)
			ON CONFLICT (prefix, key) DO NOTHING
			RETURNING ctid, window_start_us, count, prev_count, tat_us INTO l_id, l_ws, l_count, l_prev, l_tat;
			EXIT WHEN FOUND;
		END LOOP;
		now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	END IF;
	ws := now_us - now_us % p_window_us;
	duplicate := false;
	IF p_op <> 1 AND NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	IF p_op = 0 AND (p_cost < 1 OR p_cost > p_quota) THEN
		RAISE EXCEPTION 'ratekit: cost % is outside 1..%', p_cost, p_quota USING ERRCODE = '22023';
	END IF;
	IF p_op <> 1 AND p_idem IS NOT NULL THEN
		INSERT INTO "{{SCHEMA}}".idempotency_unlogged AS i (prefix, key, idempotency_key, expires_at_us)
		VALUES (p_prefix, p_key, p_idem, now_us + p_idem_ttl_us)
		ON CONFLICT (prefix, key, idempotency_key) DO UPDATE SET expires_at_us = EXCLUDED.expires_at_us
		WHERE i.expires_at_us <= now_us;
		duplicate := NOT FOUND;
	END IF;
	IF p_op = 0 AND NOT duplicate THEN
		v_ws := l_ws;
		v_count := l_count;
		IF v_ws < ws THEN
			v_ws := ws;
			v_count := 0;
		END IF;
		allowed := v_count + p_cost <= p_quota;
		IF allowed THEN
			v_count := v_count + p_cost;
			UPDATE "{{SCHEMA}}".counters_unlogged AS c SET window_start_us = v_ws, count = v_count,
				expires_at_us = GREATEST(c.expires_at_us, v_ws + p_window_us)
			WHERE c.ctid = l_id;
		END IF;
		v_found := true;
	ELSIF p_op = 2 AND NOT duplicate THEN
		-- A refund changes only a row that lockrow locked; without one the
		-- key is full as of that look-up, and a row another decision
		-- committed since must be neither changed nor read here (its clock
		-- may be later than this one's).
		IF l_id IS NOT NULL THEN
			UPDATE "{{SCHEMA}}".counters_unlogged AS c SET count = GREATEST(c.count - p_cost, 0)
			WHERE c.ctid = l_id AND c.window_start_us >= ws
			RETURNING c.window_start_us, c.count INTO v_ws, v_count;
			v_found := FOUND;
		END IF;
		IF NOT v_found THEN
			v_ws := ws;
			v_count := 0;
			v_found := true;
		END IF;
		allowed := true;
	END IF;
	IF NOT v_found THEN
		SELECT c.window_start_us, c.count INTO v_ws, v_count
		FROM "{{SCHEMA}}".counters_unlogged AS c WHERE c.prefix = p_prefix AND c.key = p_key;
		IF p_op = 1 THEN
			-- A peek locks nothing: it reads the clock after the state, so
			-- every decision it sees read its clock no later.
			now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
		END IF;
		ws := now_us - now_us % p_window_us;
		IF NOT FOUND OR v_ws < ws THEN
			v_ws := ws;
			v_count := 0;
		END IF;
	END IF;
	IF p_op = 1 OR duplicate THEN
		allowed := v_count + p_cost <= p_quota OR duplicate;
	END IF;
	remaining := GREATEST(p_quota - v_count, 0);
	reset_after_us := GREATEST(v_ws + p_window_us - now_us, 0);
	retry_after_us := CASE WHEN allowed THEN 0 ELSE reset_after_us END;
	IF p_op = 0 AND p_idem IS NOT NULL AND NOT allowed THEN
		-- A denied request consumed nothing; forget its idempotency key so a
		-- retry is judged afresh.
		DELETE FROM "{{SCHEMA}}".idempotency_unlogged AS i WHERE i.prefix = p_prefix AND i.key = p_key AND i.idempotency_key = p_idem;
	ELSIF p_op <> 1 AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- A fresh charge or refund of an idempotency key ends the other
		-- operation's record for it (the records are 't' or 'r' followed by
		-- the caller's key): a retry after a refunded failure is charged
		-- again, and a refund after that charge is not taken for a duplicate.
		DELETE FROM "{{SCHEMA}}".idempotency_unlogged AS i WHERE i.prefix = p_prefix AND i.key = p_key
			AND i.idempotency_key = (CASE WHEN p_op = 0 THEN '\x72'::bytea ELSE '\x74'::bytea END) || substring(p_idem FROM 2);
	END IF;
	IF p_cleanup > 0 THEN
		-- Only rows that expired more than one window (p_idem_ttl_us) ago:
		-- the row of a key in use is updated in place rather than deleted
		-- and created again at every window.
		PERFORM "{{SCHEMA}}".cleanup_unlogged(p_prefix, now_us - p_idem_ttl_us, p_cleanup);
	END IF;
	RETURN ARRAY[allowed::int, remaining, retry_after_us, reset_after_us, duplicate::int];
END
$fn$;

-- Sliding window: the two-window weighted count. The estimate of the units
-- in the rolling window is prev_count * (window - elapsed) / window + count;
-- the comparison is done in numeric so it is exact. A take decides on the
-- state lockrow read, as the fixed window does.
DROP FUNCTION IF EXISTS "{{SCHEMA}}".sliding_window_unlogged(bigint, text, bytea, bigint, bigint, bigint, bigint, bytea, bigint, bigint, boolean);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".sliding_window_unlogged(
	p_op bigint, p_prefix text, p_key bytea, p_cost bigint, p_quota bigint, p_window_us bigint,
	p_lock bigint, p_idem bytea, p_idem_ttl_us bigint, p_cleanup bigint, p_sync boolean)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	allowed boolean;
	remaining bigint;
	retry_after_us bigint;
	reset_after_us bigint;
	duplicate boolean;
	l_id tid;
	l_ws bigint;
	l_count bigint;
	l_prev bigint;
	l_tat bigint;
	now_us bigint;
	ws bigint;
	v_ws bigint;
	v_cur bigint;
	v_prev bigint;
	v_elapsed bigint;
	v_room numeric;
	v_found boolean := false;
BEGIN
	-- Lock the key's row first and read the clock only then, so that a
	-- decision that waited for the lock never sees a state written by a
	-- decision with a later clock. A take creates a missing row in a state
	-- that means the same as no row (every time 0), so that concurrent
	-- first takes queue on it too; so does a refund with an idempotency
	-- key, so that every transaction touches a key's idempotency records
	-- only while it holds the key's lock (two that locked two records in
	-- opposite orders would deadlock). The row's ctid and state as locked
	-- go to l_id, l_ws, l_count, l_prev and l_tat, for a take to decide on.
	IF p_op <> 1 THEN
		LOOP
			SELECT c.ctid, c.window_start_us, c.count, c.prev_count, c.tat_us INTO l_id, l_ws, l_count, l_prev, l_tat
			FROM "{{SCHEMA}}".counters_unlogged AS c WHERE c.prefix = p_prefix AND c.key = p_key FOR UPDATE;
			EXIT WHEN FOUND OR p_op <> 0 AND p_idem IS NULL;
			INSERT INTO "{{SCHEMA}}".counters_unlogged (prefix, key, expires_at_us) VALUES (p_prefix, p_key, 0)
			ON CONFLICT (prefix, key) DO NOTHING
			RETURNING ctid, window_start_us, count, prev_count, tat_us INTO l_id, l_ws, l_count, l_prev, l_tat;
			EXIT WHEN FOUND;
		END LOOP;
		now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	END IF;
	ws := now_us - now_us % p_window_us;
	duplicate := false;
	IF p_op <> 1 AND NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	IF p_op = 0 AND (p_cost < 1 OR p_cost > p_quota) THEN
		RAISE EXCEPTION 'ratekit: cost % is outside 1..%', p_cost, p_quota USING ERRCODE = '22023';
	END IF;
	IF p_op <> 1 AND p_idem IS NOT NULL THEN
		INSERT INTO "{{SCHEMA}}".idempotency_unlogged AS i (prefix, key, idempotency_key, expires_at_us)
		VALUES (p_prefix, p_key, p_idem, now_us + p_idem_ttl_us)
		ON CONFLICT (prefix, key, idempotency_key) DO UPDATE SET expires_at_us = EXCLUDED.expires_at_us
		WHERE i.expires_at_us <= now_us;
		duplicate := NOT FOUND;
	END IF;
	IF p_op = 0 AND NOT duplicate THEN
		-- The state lockrow read under the lock decides, once rolled
		-- forward below; the row is written by its ctid only when the take
		-- admits.
		v_ws := l_ws;
		v_cur := l_count;
		v_prev := l_prev;
		v_found := true;
	ELSIF p_op = 2 AND NOT duplicate THEN
		-- Only a row that lockrow locked (see the fixed window).
		IF l_id IS NOT NULL THEN
			UPDATE "{{SCHEMA}}".counters_unlogged AS c SET
				count = GREATEST(c.count - p_cost, 0),
				prev_count = CASE WHEN c.window_start_us >= ws THEN GREATEST(c.prev_count - GREATEST(p_cost - c.count, 0), 0) ELSE c.prev_count END
			WHERE c.ctid = l_id AND c.window_start_us >= ws - p_window_us
			RETURNING c.window_start_us, c.count, c.prev_count INTO v_ws, v_cur, v_prev;
			v_found := FOUND;
		END IF;
		IF NOT v_found THEN
			v_ws := ws; v_cur := 0; v_prev := 0;
			v_found := true;
		END IF;
		allowed := true;
	END IF;
	IF NOT v_found THEN
		SELECT c.window_start_us, c.count, c.prev_count INTO v_ws, v_cur, v_prev
		FROM "{{SCHEMA}}".counters_unlogged AS c WHERE c.prefix = p_prefix AND c.key = p_key;
		IF p_op = 1 THEN
			-- A peek locks nothing: it reads the clock after the state, so
			-- every decision it sees read its clock no later.
			now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
		END IF;
		ws := now_us - now_us % p_window_us;
		IF NOT FOUND THEN
			v_ws := ws; v_cur := 0; v_prev := 0;
		END IF;
	END IF;
	-- Roll the state read from the row forward to the current window.
	IF v_ws < ws THEN
		IF v_ws = ws - p_window_us THEN
			v_prev := v_cur;
		ELSE
			v_prev := 0;
		END IF;
		v_cur := 0;
		v_ws := ws;
	END IF;
	v_elapsed := GREATEST(now_us - v_ws, 0);
	-- v_room is (limit - estimate) * window, exact in numeric.
	v_room := p_quota::numeric * p_window_us - v_prev::numeric * (p_window_us - v_elapsed) - v_cur::numeric * p_window_us;
	IF p_op = 0 AND NOT duplicate THEN
		allowed := v_room >= p_cost::numeric * p_window_us;
		IF allowed THEN
			v_cur := v_cur + p_cost;
			v_room := v_room - p_cost::numeric * p_window_us;
			UPDATE "{{SCHEMA}}".counters_unlogged AS c SET window_start_us = v_ws, count = v_cur, prev_count = v_prev,
				expires_at_us = GREATEST(c.expires_at_us, v_ws + 2 * p_window_us)
			WHERE c.ctid = l_id;
		END IF;
	ELSIF p_op = 1 OR duplicate THEN
		allowed := v_room >= p_cost::numeric * p_window_us OR duplicate;
	END IF;
	remaining := GREATEST(div(v_room, p_window_us), 0)::bigint;
	reset_after_us := CASE
		WHEN v_cur > 0 THEN v_ws + 2 * p_window_us - now_us
		WHEN v_prev > 0 THEN v_ws + p_window_us - now_us
		ELSE 0 END;
	IF allowed THEN
		retry_after_us := 0;
	ELSIF v_cur + p_cost <= p_quota THEN
		-- Wait until the previous window's weight has decayed enough:
		-- v_prev * (window - x) / window <= limit - cur - cost.
		retry_after_us := GREATEST(ceil(p_window_us - (p_quota - v_cur - p_cost)::numeric * p_window_us / v_prev)::bigint - v_elapsed, 1);
	ELSE
		-- Wait for the next window, where this window's count becomes the
		-- previous one: v_cur * (window - x) / window <= limit - cost.
		retry_after_us := (v_ws + p_window_us - now_us)
			+ GREATEST(ceil(p_window_us - (p_quota - p_cost)::numeric * p_window_us / v_cur)::bigint, 0);
	END IF;
	IF p_op = 0 AND p_idem IS NOT NULL AND NOT allowed THEN
		-- A denied request consumed nothing; forget its idempotency key so a
		-- retry is judged afresh.
		DELETE FROM "{{SCHEMA}}".idempotency_unlogged AS i WHERE i.prefix = p_prefix AND i.key = p_key AND i.idempotency_key = p_idem;
	ELSIF p_op <> 1 AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- A fresh charge or refund of an idempotency key ends the other
		-- operation's record for it (the records are 't' or 'r' followed by
		-- the caller's key): a retry after a refunded failure is charged
		-- again, and a refund after that charge is not taken for a duplicate.
		DELETE FROM "{{SCHEMA}}".idempotency_unlogged AS i WHERE i.prefix = p_prefix AND i.key = p_key
			AND i.idempotency_key = (CASE WHEN p_op = 0 THEN '\x72'::bytea ELSE '\x74'::bytea END) || substring(p_idem FROM 2);
	END IF;
	IF p_cleanup > 0 THEN
		-- Only rows that expired more than one window (p_idem_ttl_us) ago:
		-- the row of a key in use is updated in place rather than deleted
		-- and created again at every window.
		PERFORM "{{SCHEMA}}".cleanup_unlogged(p_prefix, now_us - p_idem_ttl_us, p_cleanup);
	END IF;
	RETURN ARRAY[allowed::int, remaining, retry_after_us, reset_after_us, duplicate::int];
END
$fn$;

-- Token bucket as the generic cell rate algorithm (GCRA, ITU-T I.371):
-- tat_us is the theoretical arrival time; p_window_us is the emission
-- interval (time per unit) and the bucket holds p_quota units.
DROP FUNCTION IF EXISTS "{{SCHEMA}}".token_bucket_unlogged(bigint, text, bytea, bigint, bigint, bigint, bigint, bytea, bigint, bigint, boolean);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".token_bucket_unlogged(
	p_op bigint, p_prefix text, p_key bytea, p_cost bigint, p_quota bigint, p_window_us bigint,
	p_lock bigint, p_idem bytea, p_idem_ttl_us bigint, p_cleanup bigint, p_sync boolean)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	allowed boolean;
	remaining bigint;
	retry_after_us bigint;
	reset_after_us bigint;
	duplicate boolean;
	l_id tid;
	l_ws bigint;
	l_count bigint;
	l_prev bigint;
	l_tat bigint;
	now_us bigint;
	tau bigint := p_quota * p_window_us;
	v_tat bigint;
	v_found boolean := false;
BEGIN
	-- Lock the key's row first and read the clock only then, so that a
	-- decision that waited for the lock never sees a state written by a
	-- decision with a later clock. A take creates a missing row in a state
	-- that means the same as no row (every time 0), so that concurrent
	-- first takes queue on it too; so does a refund with an idempotency
	-- key, so that every transaction touches a key's idempotency records
	-- only while it holds the key's lock (two that locked two records in
	-- opposite orders would deadlock). The row's ctid and state as locked
	-- go to l_id, l_ws, l_count, l_prev and l_tat, for a take to decide on.
	IF p_op <> 1 THEN
		LOOP
			SELECT c.ctid, c.window_start_us, c.count, c.prev_count, c.tat_us INTO l_id, l_ws, l_count, l_prev, l_tat
			FROM "{{SCHEMA}}".counters_unlogged AS c WHERE c.prefix = p_prefix AND c.key = p_key FOR UPDATE;
			EXIT WHEN FOUND OR p_op <> 0 AND p_idem IS NULL;
			INSERT INTO "{{SCHEMA}}".counters_unlogged (prefix, key, expires_at_us) VALUES (p_prefix, p_key, 0)
			ON CONFLICT (prefix, key) DO NOTHING
			RETURNING ctid, window_start_us, count, prev_count, tat_us INTO l_id, l_ws, l_count, l_prev, l_tat;
			EXIT WHEN FOUND;
		END LOOP;
		now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	END IF;
	duplicate := false;
	IF p_op <> 1 AND NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	IF p_op = 0 AND (p_cost < 1 OR p_cost > p_quota) THEN
		RAISE EXCEPTION 'ratekit: cost % is outside 1..%', p_cost, p_quota USING ERRCODE = '22023';
	END IF;
	IF p_op <> 1 AND p_idem IS NOT NULL THEN
		INSERT INTO "{{SCHEMA}}".idempotency_unlogged AS i (prefix, key, idempotency_key, expires_at_us)
		VALUES (p_prefix, p_key, p_idem, now_us + p_idem_ttl_us)
		ON CONFLICT (prefix, key, idempotency_key) DO UPDATE SET expires_at_us = EXCLUDED.expires_at_us
		WHERE i.expires_at_us <= now_us;
		duplicate := NOT FOUND;
	END IF;
	IF p_op = 0 AND NOT duplicate THEN
		-- The state lockrow read under the lock decides; the row is
		-- written by its ctid only when the take admits. expires_at_us is
		-- tat rounded up to a multiple of tau, so that it changes about
		-- once per tau and most updates stay HOT.
		v_tat := GREATEST(l_tat, now_us);
		allowed := v_tat + p_cost * p_window_us - now_us <= tau;
		IF allowed THEN
			v_tat := v_tat + p_cost * p_window_us;
			UPDATE "{{SCHEMA}}".counters_unlogged AS c SET tat_us = v_tat,
				expires_at_us = GREATEST(c.expires_at_us, (v_tat / tau + 1) * tau)
			WHERE c.ctid = l_id;
		END IF;
		v_found := true;
	ELSIF p_op = 2 AND NOT duplicate THEN
		-- Only a row that lockrow locked (see the fixed window).
		IF l_id IS NOT NULL THEN
			UPDATE "{{SCHEMA}}".counters_unlogged AS c SET tat_us = GREATEST(c.tat_us - p_cost * p_window_us, now_us)
			WHERE c.ctid = l_id AND c.tat_us > now_us
			RETURNING c.tat_us INTO v_tat;
			v_found := FOUND;
		END IF;
		IF NOT v_found THEN
			v_tat := now_us;
			v_found := true;
		END IF;
		allowed := true;
	END IF;
	IF NOT v_found THEN
		SELECT c.tat_us INTO v_tat FROM "{{SCHEMA}}".counters_unlogged AS c WHERE c.prefix = p_prefix AND c.key = p_key;
		IF p_op = 1 THEN
			-- A peek locks nothing: it reads the clock after the state, so
			-- every decision it sees read its clock no later.
			now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
		END IF;
		IF NOT FOUND THEN
			v_tat := now_us;
		END IF;
	END IF;
	v_tat := GREATEST(v_tat, now_us);
	IF p_op = 1 OR duplicate THEN
		allowed := v_tat + p_cost * p_window_us - now_us <= tau OR duplicate;
	END IF;
	remaining := GREATEST((tau - (v_tat - now_us)) / p_window_us, 0);
	reset_after_us := v_tat - now_us;
	retry_after_us := CASE WHEN allowed THEN 0 ELSE GREATEST(v_tat + p_cost * p_window_us - tau - now_us, 1) END;
	IF p_op = 0 AND p_idem IS NOT NULL AND NOT allowed THEN
		-- A denied request consumed nothing; forget its idempotency key so a
		-- retry is judged afresh.
		DELETE FROM "{{SCHEMA}}".idempotency_unlogged AS i WHERE i.prefix = p_prefix AND i.key = p_key AND i.idempotency_key = p_idem;
	ELSIF p_op <> 1 AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- A fresh charge or refund of an idempotency key ends the other
		-- operation's record for it (the records are 't' or 'r' followed by
		-- the caller's key): a retry after a refunded failure is charged
		-- again, and a refund after that charge is not taken for a duplicate.
		DELETE FROM "{{SCHEMA}}".idempotency_unlogged AS i WHERE i.prefix = p_prefix AND i.key = p_key
			AND i.idempotency_key = (CASE WHEN p_op = 0 THEN '\x72'::bytea ELSE '\x74'::bytea END) || substring(p_idem FROM 2);
	END IF;
	IF p_cleanup > 0 THEN
		-- Only rows that expired more than one window (p_idem_ttl_us) ago:
		-- the row of a key in use is updated in place rather than deleted
		-- and created again at every window.
		PERFORM "{{SCHEMA}}".cleanup_unlogged(p_prefix, now_us - p_idem_ttl_us, p_cleanup);
	END IF;
	RETURN ARRAY[allowed::int, remaining, retry_after_us, reset_after_us, duplicate::int];
END
$fn$;

-- Sliding log: one row per admitted request. The transaction-level advisory
-- lock p_lock serialises the decisions of one (prefix, key); the clock is
-- read after it is granted, so every decision sees all earlier ones.
DROP FUNCTION IF EXISTS "{{SCHEMA}}".sliding_log_unlogged(bigint, text, bytea, bigint, bigint, bigint, bigint, bytea, bigint, bigint, boolean);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".sliding_log_unlogged(
	p_op bigint, p_prefix text, p_key bytea, p_cost bigint, p_quota bigint, p_window_us bigint,
	p_lock bigint, p_idem bytea, p_idem_ttl_us bigint, p_cleanup bigint, p_sync boolean)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	allowed boolean;
	remaining bigint;
	retry_after_us bigint;
	reset_after_us bigint;
	duplicate boolean;
	l_id tid;
	l_ws bigint;
	l_count bigint;
	l_prev bigint;
	l_tat bigint;
	now_us bigint;
	v_used bigint;
	v_last bigint;
	v_left bigint;
	v_free bigint;
	r record;
BEGIN
	IF p_op <> 1 THEN
		PERFORM pg_advisory_xact_lock(p_lock);
	END IF;
	now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	duplicate := false;
	IF p_op <> 1 AND NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	IF p_op = 0 AND (p_cost < 1 OR p_cost > p_quota) THEN
		RAISE EXCEPTION 'ratekit: cost % is outside 1..%', p_cost, p_quota USING ERRCODE = '22023';
	END IF;
	IF p_op <> 1 AND p_idem IS NOT NULL THEN
		INSERT INTO "{{SCHEMA}}".idempotency_unlogged AS i (prefix, key, idempotency_key, expires_at_us)
		VALUES (p_prefix, p_key, p_idem, now_us + p_idem_ttl_us)
		ON CONFLICT (prefix, key, idempotency_key) DO UPDATE SET expires_at_us = EXCLUDED.expires_at_us
		WHERE i.expires_at_us <= now_us;
		duplicate := NOT FOUND;
	END IF;
	-- Per-key conditions on expires_at_us are written "+ 0" so that the
	-- planner cannot use the (prefix, expires_at_us) cleanup index for them:
	-- on a fresh table without statistics it otherwise prefers that index
	-- and scans every row of the prefix.
	IF p_op <> 1 THEN
		DELETE FROM "{{SCHEMA}}".log_unlogged AS l WHERE l.prefix = p_prefix AND l.key = p_key AND l.expires_at_us + 0 <= now_us;
	END IF;
	SELECT COALESCE(sum(l.cost), 0), max(l.expires_at_us) INTO v_used, v_last
	FROM "{{SCHEMA}}".log_unlogged AS l WHERE l.prefix = p_prefix AND l.key = p_key AND l.expires_at_us + 0 > now_us;
	IF p_op = 0 AND NOT duplicate THEN
		allowed := v_used + p_cost <= p_quota;
		IF allowed THEN
			INSERT INTO "{{SCHEMA}}".log_unlogged (prefix, key, at_us, cost, expires_at_us)
			VALUES (p_prefix, p_key, now_us, p_cost, now_us + p_window_us);
			v_used := v_used + p_cost;
			v_last := now_us + p_window_us;
		END IF;
	ELSIF p_op = 2 AND NOT duplicate THEN
		-- Give back the most recent admissions first.
		v_left := p_cost;
		FOR r IN SELECT l.ctid AS id, l.cost FROM "{{SCHEMA}}".log_unlogged AS l
			WHERE l.prefix = p_prefix AND l.key = p_key AND l.expires_at_us + 0 > now_us
			ORDER BY l.at_us DESC LOOP
			EXIT WHEN v_left = 0;
			IF r.cost <= v_left THEN
				DELETE FROM "{{SCHEMA}}".log_unlogged AS l WHERE l.ctid = r.id;
				v_left := v_left - r.cost;
				v_used := v_used - r.cost;
			ELSE
				UPDATE "{{SCHEMA}}".log_unlogged AS l SET cost = l.cost - v_left WHERE l.ctid = r.id;
				v_used := v_used - v_left;
				v_left := 0;
			END IF;
		END LOOP;
		allowed := true;
	ELSE
		allowed := v_used + p_cost <= p_quota OR duplicate;
	END IF;
	remaining := GREATEST(p_quota - v_used, 0);
	reset_after_us := CASE WHEN v_used > 0 THEN GREATEST(v_last - now_us, 0) ELSE 0 END;
	IF allowed THEN
		retry_after_us := 0;
	ELSE
		-- The earliest expiry after which enough units have left the window.
		SELECT x.expires_at_us INTO v_free FROM (
			SELECT l.expires_at_us, sum(l.cost) OVER (ORDER BY l.expires_at_us, l.at_us ROWS UNBOUNDED PRECEDING) AS freed
			FROM "{{SCHEMA}}".log_unlogged AS l WHERE l.prefix = p_prefix AND l.key = p_key AND l.expires_at_us + 0 > now_us
		) AS x WHERE v_used - x.freed + p_cost <= p_quota ORDER BY x.expires_at_us LIMIT 1;
		retry_after_us := GREATEST(COALESCE(v_free, v_last) - now_us, 1);
	END IF;
	IF p_op = 0 AND p_idem IS NOT NULL AND NOT allowed THEN
		-- A denied request consumed nothing; forget its idempotency key so a
		-- retry is judged afresh.
		DELETE FROM "{{SCHEMA}}".idempotency_unlogged AS i WHERE i.prefix = p_prefix AND i.key = p_key AND i.idempotency_key = p_idem;
	ELSIF p_op <> 1 AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- A fresh charge or refund of an idempotency key ends the other
		-- operation's record for it (the records are 't' or 'r' followed by
		-- the caller's key): a retry after a refunded failure is charged
		-- again, and a refund after that charge is not taken for a duplicate.
		DELETE FROM "{{SCHEMA}}".idempotency_unlogged AS i WHERE i.prefix = p_prefix AND i.key = p_key
			AND i.idempotency_key = (CASE WHEN p_op = 0 THEN '\x72'::bytea ELSE '\x74'::bytea END) || substring(p_idem FROM 2);
	END IF;
	IF p_cleanup > 0 THEN
		-- Only rows that expired more than one window (p_idem_ttl_us) ago:
		-- the row of a key in use is updated in place rather than deleted
		-- and created again at every window.
		PERFORM "{{SCHEMA}}".cleanup_unlogged(p_prefix, now_us - p_idem_ttl_us, p_cleanup);
	END IF;
	RETURN ARRAY[allowed::int, remaining, retry_after_us, reset_after_us, duplicate::int];
END
$fn$;

CREATE TABLE IF NOT EXISTS "{{SCHEMA}}".counters (
	prefix          text   NOT NULL,
	key             bytea  NOT NULL,
	window_start_us bigint NOT NULL DEFAULT 0,
	count           bigint NOT NULL DEFAULT 0,
	prev_count      bigint NOT NULL DEFAULT 0,
	tat_us          bigint NOT NULL DEFAULT 0,
	expires_at_us   bigint NOT NULL,
	PRIMARY KEY (prefix, key)
) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS counters_expiry ON "{{SCHEMA}}".counters (prefix, expires_at_us);

CREATE TABLE IF NOT EXISTS "{{SCHEMA}}".log (
	prefix        text   NOT NULL,
	key           bytea  NOT NULL,
	at_us         bigint NOT NULL,
	cost          bigint NOT NULL,
	expires_at_us bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS log_key ON "{{SCHEMA}}".log (prefix, key, expires_at_us);
CREATE INDEX IF NOT EXISTS log_expiry ON "{{SCHEMA}}".log (prefix, expires_at_us);

CREATE TABLE IF NOT EXISTS "{{SCHEMA}}".idempotency (
	prefix          text   NOT NULL,
	key             bytea  NOT NULL,
	idempotency_key bytea  NOT NULL,
	expires_at_us   bigint NOT NULL,
	PRIMARY KEY (prefix, key, idempotency_key)
);
CREATE INDEX IF NOT EXISTS idempotency_expiry ON "{{SCHEMA}}".idempotency (prefix, expires_at_us);

-- The units each key used in each ended period of a calendar-period policy
-- (composite algorithm 5), moved here from the counter row, in the
-- transaction that starts the key's next period: a period's usage is in
-- the counter row while it is the row's period and here after, never in
-- both, so one statement that reads both is exact. Nothing deletes these
-- rows: they are billing records.
CREATE TABLE IF NOT EXISTS "{{SCHEMA}}".period_usage (
	prefix          text   NOT NULL,
	key             bytea  NOT NULL,
	period_start_us bigint NOT NULL,
	period_end_us   bigint NOT NULL,
	used            bigint NOT NULL,
	PRIMARY KEY (prefix, period_start_us, key)
);

-- Cleanup: delete up to p_quota rows of each table under p_prefix that
-- expired before p_before, skipping rows locked by others, and return how
-- many of each (counters, log entries, idempotency records), found through
-- the expiry indexes (see enable_seqscan above).
DROP FUNCTION IF EXISTS "{{SCHEMA}}".cleanup(text, bigint, bigint);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".cleanup(p_prefix text, p_before bigint, p_quota bigint)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	a bigint;
	b bigint;
	c bigint;
BEGIN
	DELETE FROM "{{SCHEMA}}".counters AS x WHERE x.ctid = ANY (ARRAY(
		SELECT e.ctid FROM "{{SCHEMA}}".counters AS e WHERE e.prefix = p_prefix AND e.expires_at_us < p_before
		LIMIT p_quota FOR UPDATE SKIP LOCKED));
	GET DIAGNOSTICS a = ROW_COUNT;
	DELETE FROM "{{SCHEMA}}".log AS x WHERE x.ctid = ANY (ARRAY(
		SELECT e.ctid FROM "{{SCHEMA}}".log AS e WHERE e.prefix = p_prefix AND e.expires_at_us < p_before
		LIMIT p_quota FOR UPDATE SKIP LOCKED));
	GET DIAGNOSTICS b = ROW_COUNT;
	DELETE FROM "{{SCHEMA}}".idempotency AS x WHERE x.ctid = ANY (ARRAY(
		SELECT e.ctid FROM "{{SCHEMA}}".idempotency AS e WHERE e.prefix = p_prefix AND e.expires_at_us < p_before
		LIMIT p_quota FOR UPDATE SKIP LOCKED));
	GET DIAGNOSTICS c = ROW_COUNT;
	RETURN ARRAY[a, b, c];
END
$fn$;

-- Fixed window: windows aligned to the epoch; count is the units taken in
-- the window that starts at window_start_us. A take decides on the state
-- that lockrow read under the lock and writes the row by its ctid only when
-- it admits: no upsert after the lock, and no second look-up of the key.
DROP FUNCTION IF EXISTS "{{SCHEMA}}".fixed_window(bigint, text, bytea, bigint, bigint, bigint, bigint, bytea, bigint, bigint, boolean);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".fixed_window(
	p_op bigint, p_prefix text, p_key bytea, p_cost bigint, p_quota bigint, p_window_us bigint,
	p_lock bigint, p_idem bytea, p_idem_ttl_us bigint, p_cleanup bigint, p_sync boolean)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	allowed boolean;
	remaining bigint;
	retry_after_us bigint;
	reset_after_us bigint;
	duplicate boolean;
	l_id tid;
	l_ws bigint;
	l_count bigint;
	l_prev bigint;
	l_tat bigint;
	now_us bigint;
	ws bigint;
	v_ws bigint;
	v_count bigint;
	v_found boolean := false;
BEGIN
	-- Lock the key's row first and read the clock only then, so that a
	-- decision that waited for the lock never sees a state written by a
	-- decision with a later clock. A take creates a missing row in a state
	-- that means the same as no row (every time 0), so that concurrent
	-- first takes queue on it too; so does a refund with an idempotency
	-- key, so that every transaction touches a key's idempotency records
	-- only while it holds the key's lock (two that locked two records in
	-- opposite orders would deadlock). The row's ctid and state as locked
	-- go to l_id, l_ws, l_count, l_prev and l_tat, for a take to decide on.
	IF p_op <> 1 THEN
		LOOP
			SELECT c.ctid, c.window_start_us, c.count, c.prev_count, c.tat_us INTO l_id, l_ws, l_count, l_prev, l_tat
			FROM "{{SCHEMA}}".counters AS c WHERE c.prefix = p_prefix AND c.key = p_key FOR UPDATE;
			EXIT WHEN FOUND OR p_op <> 0 AND p_idem IS NULL;
			INSERT INTO "{{SCHEMA}}".counters (prefix, key, expires_at_us) VALUES (p_prefix, p_key, 0)
			ON CONFLICT (prefix, key) DO NOTHING
			RETURNING ctid, window_start_us, count, prev_count, tat_us INTO l_id, l_ws, l_count, l_prev, l_tat;
			EXIT WHEN FOUND;
		END LOOP;
		now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	END IF;
	ws := now_us - now_us % p_window_us;
	duplicate := false;
	IF p_op <> 1 AND NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	IF p_op = 0 AND (p_cost < 1 OR p_cost > p_quota) THEN
		RAISE EXCEPTION 'ratekit: cost % is outside 1..%', p_cost, p_quota USING ERRCODE = '22023';
	END IF;
	IF p_op <> 1 AND p_idem IS NOT NULL THEN
		INSERT INTO "{{SCHEMA}}".idempotency AS i (prefix, key, idempotency_key, expires_at_us)
		VALUES (p_prefix, p_key, p_idem, now_us + p_idem_ttl_us)
		ON CONFLICT (prefix, key, idempotency_key) DO UPDATE SET expires_at_us = EXCLUDED.expires_at_us
		WHERE i.expires_at_us <= now_us;
		duplicate := NOT FOUND;
	END IF;
	IF p_op = 0 AND NOT duplicate THEN
		v_ws := l_ws;
		v_count := l_count;
		IF v_ws < ws THEN
			v_ws := ws;
			v_count := 0;
		END IF;
		allowed := v_count + p_cost <= p_quota;
		IF allowed THEN
			v_count := v_count + p_cost;
			UPDATE "{{SCHEMA}}".counters AS c SET window_start_us = v_ws, count = v_count,
				expires_at_us = GREATEST(c.expires_at_us, v_ws + p_window_us)
			WHERE c.ctid = l_id;
		END IF;
		v_found := true;
	ELSIF p_op = 2 AND NOT duplicate THEN
		-- A refund changes only a row that lockrow locked; without one the
		-- key is full as of that look-up, and a row another decision
		-- committed since must be neither changed nor read here (its clock
		-- may be later than this one's).
		IF l_id IS NOT NULL THEN
			UPDATE "{{SCHEMA}}".counters AS c SET count = GREATEST(c.count - p_cost, 0)
			WHERE c.ctid = l_id AND c.window_start_us >= ws
			RETURNING c.window_start_us, c.count INTO v_ws, v_count;
			v_found := FOUND;
		END IF;
		IF NOT v_found THEN
			v_ws := ws;
			v_count := 0;
			v_found := true;
		END IF;
		allowed := true;
	END IF;
	IF NOT v_found THEN
		SELECT c.window_start_us, c.count INTO v_ws, v_count
		FROM "{{SCHEMA}}".counters AS c WHERE c.prefix = p_prefix AND c.key = p_key;
		IF p_op = 1 THEN
			-- A peek locks nothing: it reads the clock after the state, so
			-- every decision it sees read its clock no later.
			now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
		END IF;
		ws := now_us - now_us % p_window_us;
		IF NOT FOUND OR v_ws < ws THEN
			v_ws := ws;
			v_count := 0;
		END IF;
	END IF;
	IF p_op = 1 OR duplicate THEN
		allowed := v_count + p_cost <= p_quota OR duplicate;
	END IF;
	remaining := GREATEST(p_quota - v_count, 0);
	reset_after_us := GREATEST(v_ws + p_window_us - now_us, 0);
	retry_after_us := CASE WHEN allowed THEN 0 ELSE reset_after_us END;
	IF p_op = 0 AND p_idem IS NOT NULL AND NOT allowed THEN
		-- A denied request consumed nothing; forget its idempotency key so a
		-- retry is judged afresh.
		DELETE FROM "{{SCHEMA}}".idempotency AS i WHERE i.prefix = p_prefix AND i.key = p_key AND i.idempotency_key = p_idem;
	ELSIF p_op <> 1 AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- A fresh charge or refund of an idempotency key ends the other
		-- operation's record for it (the records are 't' or 'r' followed by
		-- the caller's key): a retry after a refunded failure is charged
		-- again, and a refund after that charge is not taken for a duplicate.
		DELETE FROM "{{SCHEMA}}".idempotency AS i WHERE i.prefix = p_prefix AND i.key = p_key
			AND i.idempotency_key = (CASE WHEN p_op = 0 THEN '\x72'::bytea ELSE '\x74'::bytea END) || substring(p_idem FROM 2);
	END IF;
	IF p_cleanup > 0 THEN
		-- Only rows that expired more than one window (p_idem_ttl_us) ago:
		-- the row of a key in use is updated in place rather than deleted
		-- and created again at every window.
		PERFORM "{{SCHEMA}}".cleanup(p_prefix, now_us - p_idem_ttl_us, p_cleanup);
	END IF;
	RETURN ARRAY[allowed::int, remaining, retry_after_us, reset_after_us, duplicate::int];
END
$fn$;

-- Sliding window: the two-window weighted count. The estimate of the units
-- in the rolling window is prev_count * (window - elapsed) / window + count;
-- the comparison is done in numeric so it is exact. A take decides on the
-- state lockrow read, as the fixed window does.
DROP FUNCTION IF EXISTS "{{SCHEMA}}".sliding_window(bigint, text, bytea, bigint, bigint, bigint, bigint, bytea, bigint, bigint, boolean);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".sliding_window(
	p_op bigint, p_prefix text, p_key bytea, p_cost bigint, p_quota bigint, p_window_us bigint,
	p_lock bigint, p_idem bytea, p_idem_ttl_us bigint, p_cleanup bigint, p_sync boolean)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	allowed boolean;
	remaining bigint;
	retry_after_us bigint;
	reset_after_us bigint;
	duplicate boolean;
	l_id tid;
	l_ws bigint;
	l_count bigint;
	l_prev bigint;
	l_tat bigint;
	now_us bigint;
	ws bigint;
	v_ws bigint;
	v_cur bigint;
	v_prev bigint;
	v_elapsed bigint;
	v_room numeric;
	v_found boolean := false;
BEGIN
	-- Lock the key's row first and read the clock only then, so that a
	-- decision that waited for the lock never sees a state written by a
	-- decision with a later clock. A take creates a missing row in a state
	-- that means the same as no row (every time 0), so that concurrent
	-- first takes queue on it too; so does a refund with an idempotency
	-- key, so that every transaction touches a key's idempotency records
	-- only while it holds the key's lock (two that locked two records in
	-- opposite orders would deadlock). The row's ctid and state as locked
	-- go to l_id, l_ws, l_count, l_prev and l_tat, for a take to decide on.
	IF p_op <> 1 THEN
		LOOP
			SELECT c.ctid, c.window_start_us, c.count, c.prev_count, c.tat_us INTO l_id, l_ws, l_count, l_prev, l_tat
			FROM "{{SCHEMA}}".counters AS c WHERE c.prefix = p_prefix AND c.key = p_key FOR UPDATE;
			EXIT WHEN FOUND OR p_op <> 0 AND p_idem IS NULL;
			INSERT INTO "{{SCHEMA}}".counters (prefix, key, expires_at_us) VALUES (p_prefix, p_key, 0)
			ON CONFLICT (prefix, key) DO NOTHING
			RETURNING ctid, window_start_us, count, prev_count, tat_us INTO l_id, l_ws, l_count, l_prev, l_tat;
			EXIT WHEN FOUND;
		END LOOP;
		now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	END IF;
	ws := now_us - now_us % p_window_us;
	duplicate := false;
	IF p_op <> 1 AND NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	IF p_op = 0 AND (p_cost < 1 OR p_cost > p_quota) THEN
		RAISE EXCEPTION 'ratekit: cost % is outside 1..%', p_cost, p_quota USING ERRCODE = '22023';
	END IF;
	IF p_op <> 1 AND p_idem IS NOT NULL THEN
		INSERT INTO "{{SCHEMA}}".idempotency AS i (prefix, key, idempotency_key, expires_at_us)
		VALUES (p_prefix, p_key, p_idem, now_us + p_idem_ttl_us)
		ON CONFLICT (prefix, key, idempotency_key) DO UPDATE SET expires_at_us = EXCLUDED.expires_at_us
		WHERE i.expires_at_us <= now_us;
		duplicate := NOT FOUND;
	END IF;
	IF p_op = 0 AND NOT duplicate THEN
		-- The state lockrow read under the lock decides, once rolled
		-- forward below; the row is written by its ctid only when the take
		-- admits.
		v_ws := l_ws;
		v_cur := l_count;
		v_prev := l_prev;
		v_found := true;
	ELSIF p_op = 2 AND NOT duplicate THEN
		-- Only a row that lockrow locked (see the fixed window).
		IF l_id IS NOT NULL THEN
			UPDATE "{{SCHEMA}}".counters AS c SET
				count = GREATEST(c.count - p_cost, 0),
				prev_count = CASE WHEN c.window_start_us >= ws THEN GREATEST(c.prev_count - GREATEST(p_cost - c.count, 0), 0) ELSE c.prev_count END
			WHERE c.ctid = l_id AND c.window_start_us >= ws - p_window_us
			RETURNING c.window_start_us, c.count, c.prev_count INTO v_ws, v_cur, v_prev;
			v_found := FOUND;
		END IF;
		IF NOT v_found THEN
			v_ws := ws; v_cur := 0; v_prev := 0;
			v_found := true;
		END IF;
		allowed := true;
	END IF;
	IF NOT v_found THEN
		SELECT c.window_start_us, c.count, c.prev_count INTO v_ws, v_cur, v_prev
		FROM "{{SCHEMA}}".counters AS c WHERE c.prefix = p_prefix AND c.key = p_key;
		IF p_op = 1 THEN
			-- A peek locks nothing: it reads the clock after the state, so
			-- every decision it sees read its clock no later.
			now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
		END IF;
		ws := now_us - now_us % p_window_us;
		IF NOT FOUND THEN
			v_ws := ws; v_cur := 0; v_prev := 0;
		END IF;
	END IF;
	-- Roll the state read from the row forward to the current window.
	IF v_ws < ws THEN
		IF v_ws = ws - p_window_us THEN
			v_prev := v_cur;
		ELSE
			v_prev := 0;
		END IF;
		v_cur := 0;
		v_ws := ws;
	END IF;
	v_elapsed := GREATEST(now_us - v_ws, 0);
	-- v_room is (limit - estimate) * window, exact in numeric.
	v_room := p_quota::numeric * p_window_us - v_prev::numeric * (p_window_us - v_elapsed) - v_cur::numeric * p_window_us;
	IF p_op = 0 AND NOT duplicate THEN
		allowed := v_room >= p_cost::numeric * p_window_us;
		IF allowed THEN
			v_cur := v_cur + p_cost;
			v_room := v_room - p_cost::numeric * p_window_us;
			UPDATE "{{SCHEMA}}".counters AS c SET window_start_us = v_ws, count = v_cur, prev_count = v_prev,
				expires_at_us = GREATEST(c.expires_at_us, v_ws + 2 * p_window_us)
			WHERE c.ctid = l_id;
		END IF;
	ELSIF p_op = 1 OR duplicate THEN
		allowed := v_room >= p_cost::numeric * p_window_us OR duplicate;
	END IF;
	remaining := GREATEST(div(v_room, p_window_us), 0)::bigint;
	reset_after_us := CASE
		WHEN v_cur > 0 THEN v_ws + 2 * p_window_us - now_us
		WHEN v_prev > 0 THEN v_ws + p_window_us - now_us
		ELSE 0 END;
	IF allowed THEN
		retry_after_us := 0;
	ELSIF v_cur + p_cost <= p_quota THEN
		-- Wait until the previous window's weight has decayed enough:
		-- v_prev * (window - x) / window <= limit - cur - cost.
		retry_after_us := GREATEST(ceil(p_window_us - (p_quota - v_cur - p_cost)::numeric * p_window_us / v_prev)::bigint - v_elapsed, 1);
	ELSE
		-- Wait for the next window, where this window's count becomes the
		-- previous one: v_cur * (window - x) / window <= limit - cost.
		retry_after_us := (v_ws + p_window_us - now_us)
			+ GREATEST(ceil(p_window_us - (p_quota - p_cost)::numeric * p_window_us / v_cur)::bigint, 0);
	END IF;
	IF p_op = 0 AND p_idem IS NOT NULL AND NOT allowed THEN
		-- A denied request consumed nothing; forget its idempotency key so a
		-- retry is judged afresh.
		DELETE FROM "{{SCHEMA}}".idempotency AS i WHERE i.prefix = p_prefix AND i.key = p_key AND i.idempotency_key = p_idem;
	ELSIF p_op <> 1 AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- A fresh charge or refund of an idempotency key ends the other
		-- operation's record for it (the records are 't' or 'r' followed by
		-- the caller's key): a retry after a refunded failure is charged
		-- again, and a refund after that charge is not taken for a duplicate.
		DELETE FROM "{{SCHEMA}}".idempotency AS i WHERE i.prefix = p_prefix AND i.key = p_key
			AND i.idempotency_key = (CASE WHEN p_op = 0 THEN '\x72'::bytea ELSE '\x74'::bytea END) || substring(p_idem FROM 2);
	END IF;
	IF p_cleanup > 0 THEN
		-- Only rows that expired more than one window (p_idem_ttl_us) ago:
		-- the row of a key in use is updated in place rather than deleted
		-- and created again at every window.
		PERFORM "{{SCHEMA}}".cleanup(p_prefix, now_us - p_idem_ttl_us, p_cleanup);
	END IF;
	RETURN ARRAY[allowed::int, remaining, retry_after_us, reset_after_us, duplicate::int];
END
$fn$;

-- Token bucket as the generic cell rate algorithm (GCRA, ITU-T I.371):
-- tat_us is the theoretical arrival time; p_window_us is the emission
-- interval (time per unit) and the bucket holds p_quota units.
DROP FUNCTION IF EXISTS "{{SCHEMA}}".token_bucket(bigint, text, bytea, bigint, bigint, bigint, bigint, bytea, bigint, bigint, boolean);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".token_bucket(
	p_op bigint, p_prefix text, p_key bytea, p_cost bigint, p_quota bigint, p_window_us bigint,
	p_lock bigint, p_idem bytea, p_idem_ttl_us bigint, p_cleanup bigint, p_sync boolean)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	allowed boolean;
	remaining bigint;
	retry_after_us bigint;
	reset_after_us bigint;
	duplicate boolean;
	l_id tid;
	l_ws bigint;
	l_count bigint;
	l_prev bigint;
	l_tat bigint;
	now_us bigint;
	tau bigint := p_quota * p_window_us;
	v_tat bigint;
	v_found boolean := false;
BEGIN
	-- Lock the key's row first and read the clock only then, so that a
	-- decision that waited for the lock never sees a state written by a
	-- decision with a later clock. A take creates a missing row in a state
	-- that means the same as no row (every time 0), so that concurrent
	-- first takes queue on it too; so does a refund with an idempotency
	-- key, so that every transaction touches a key's idempotency records
	-- only while it holds the key's lock (two that locked two records in
	-- opposite orders would deadlock). The row's ctid and state as locked
	-- go to l_id, l_ws, l_count, l_prev and l_tat, for a take to decide on.
	IF p_op <> 1 THEN
		LOOP
			SELECT c.ctid, c.window_start_us, c.count, c.prev_count, c.tat_us INTO l_id, l_ws, l_count, l_prev, l_tat
			FROM "{{SCHEMA}}".counters AS c WHERE c.prefix = p_prefix AND c.key = p_key FOR UPDATE;
			EXIT WHEN FOUND OR p_op <> 0 AND p_idem IS NULL;
			INSERT INTO "{{SCHEMA}}".counters (prefix, key, expires_at_us) VALUES (p_prefix, p_key, 0)
			ON CONFLICT (prefix, key) DO NOTHING
			RETURNING ctid, window_start_us, count, prev_count, tat_us INTO l_id, l_ws, l_count, l_prev, l_tat;
			EXIT WHEN FOUND;
		END LOOP;
		now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	END IF;
	duplicate := false;
	IF p_op <> 1 AND NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	IF p_op = 0 AND (p_cost < 1 OR p_cost > p_quota) THEN
		RAISE EXCEPTION 'ratekit: cost % is outside 1..%', p_cost, p_quota USING ERRCODE = '22023';
	END IF;
	IF p_op <> 1 AND p_idem IS NOT NULL THEN
		INSERT INTO "{{SCHEMA}}".idempotency AS i (prefix, key, idempotency_key, expires_at_us)
		VALUES (p_prefix, p_key, p_idem, now_us + p_idem_ttl_us)
		ON CONFLICT (prefix, key, idempotency_key) DO UPDATE SET expires_at_us = EXCLUDED.expires_at_us
		WHERE i.expires_at_us <= now_us;
		duplicate := NOT FOUND;
	END IF;
	IF p_op = 0 AND NOT duplicate THEN
		-- The state lockrow read under the lock decides; the row is
		-- written by its ctid only when the take admits. expires_at_us is
		-- tat rounded up to a multiple of tau, so that it changes about
		-- once per tau and most updates stay HOT.
		v_tat := GREATEST(l_tat, now_us);
		allowed := v_tat + p_cost * p_window_us - now_us <= tau;
		IF allowed THEN
			v_tat := v_tat + p_cost * p_window_us;
			UPDATE "{{SCHEMA}}".counters AS c SET tat_us = v_tat,
				expires_at_us = GREATEST(c.expires_at_us, (v_tat / tau + 1) * tau)
			WHERE c.ctid = l_id;
		END IF;
		v_found := true;
	ELSIF p_op = 2 AND NOT duplicate THEN
		-- Only a row that lockrow locked (see the fixed window).
		IF l_id IS NOT NULL THEN
			UPDATE "{{SCHEMA}}".counters AS c SET tat_us = GREATEST(c.tat_us - p_cost * p_window_us, now_us)
			WHERE c.ctid = l_id AND c.tat_us > now_us
			RETURNING c.tat_us INTO v_tat;
			v_found := FOUND;
		END IF;
		IF NOT v_found THEN
			v_tat := now_us;
			v_found := true;
		END IF;
		allowed := true;
	END IF;
	IF NOT v_found THEN
		SELECT c.tat_us INTO v_tat FROM "{{SCHEMA}}".counters AS c WHERE c.prefix = p_prefix AND c.key = p_key;
		IF p_op = 1 THEN
			-- A peek locks nothing: it reads the clock after the state, so
			-- every decision it sees read its clock no later.
			now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
		END IF;
		IF NOT FOUND THEN
			v_tat := now_us;
		END IF;
	END IF;
	v_tat := GREATEST(v_tat, now_us);
	IF p_op = 1 OR duplicate THEN
		allowed := v_tat + p_cost * p_window_us - now_us <= tau OR duplicate;
	END IF;
	remaining := GREATEST((tau - (v_tat - now_us)) / p_window_us, 0);
	reset_after_us := v_tat - now_us;
	retry_after_us := CASE WHEN allowed THEN 0 ELSE GREATEST(v_tat + p_cost * p_window_us - tau - now_us, 1) END;
	IF p_op = 0 AND p_idem IS NOT NULL AND NOT allowed THEN
		-- A denied request consumed nothing; forget its idempotency key so a
		-- retry is judged afresh.
		DELETE FROM "{{SCHEMA}}".idempotency AS i WHERE i.prefix = p_prefix AND i.key = p_key AND i.idempotency_key = p_idem;
	ELSIF p_op <> 1 AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- A fresh charge or refund of an idempotency key ends the other
		-- operation's record for it (the records are 't' or 'r' followed by
		-- the caller's key): a retry after a refunded failure is charged
		-- again, and a refund after that charge is not taken for a duplicate.
		DELETE FROM "{{SCHEMA}}".idempotency AS i WHERE i.prefix = p_prefix AND i.key = p_key
			AND i.idempotency_key = (CASE WHEN p_op = 0 THEN '\x72'::bytea ELSE '\x74'::bytea END) || substring(p_idem FROM 2);
	END IF;
	IF p_cleanup > 0 THEN
		-- Only rows that expired more than one window (p_idem_ttl_us) ago:
		-- the row of a key in use is updated in place rather than deleted
		-- and created again at every window.
		PERFORM "{{SCHEMA}}".cleanup(p_prefix, now_us - p_idem_ttl_us, p_cleanup);
	END IF;
	RETURN ARRAY[allowed::int, remaining, retry_after_us, reset_after_us, duplicate::int];
END
$fn$;

-- Sliding log: one row per admitted request. The transaction-level advisory
-- lock p_lock serialises the decisions of one (prefix, key); the clock is
-- read after it is granted, so every decision sees all earlier ones.
DROP FUNCTION IF EXISTS "{{SCHEMA}}".sliding_log(bigint, text, bytea, bigint, bigint, bigint, bigint, bytea, bigint, bigint, boolean);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".sliding_log(
	p_op bigint, p_prefix text, p_key bytea, p_cost bigint, p_quota bigint, p_window_us bigint,
	p_lock bigint, p_idem bytea, p_idem_ttl_us bigint, p_cleanup bigint, p_sync boolean)
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	allowed boolean;
	remaining bigint;
	retry_after_us bigint;
	reset_after_us bigint;
	duplicate boolean;
	l_id tid;
	l_ws bigint;
	l_count bigint;
	l_prev bigint;
	l_tat bigint;
	now_us bigint;
	v_used bigint;
	v_last bigint;
	v_left bigint;
	v_free bigint;
	r record;
BEGIN
	IF p_op <> 1 THEN
		PERFORM pg_advisory_xact_lock(p_lock);
	END IF;
	now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	duplicate := false;
	IF p_op <> 1 AND NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	IF p_op = 0 AND (p_cost < 1 OR p_cost > p_quota) THEN
		RAISE EXCEPTION 'ratekit: cost % is outside 1..%', p_cost, p_quota USING ERRCODE = '22023';
	END IF;
	IF p_op <> 1 AND p_idem IS NOT NULL THEN
		INSERT INTO "{{SCHEMA}}".idempotency AS i (prefix, key, idempotency_key, expires_at_us)
		VALUES (p_prefix, p_key, p_idem, now_us + p_idem_ttl_us)
		ON CONFLICT (prefix, key, idempotency_key) DO UPDATE SET expires_at_us = EXCLUDED.expires_at_us
		WHERE i.expires_at_us <= now_us;
		duplicate := NOT FOUND;
	END IF;
	-- Per-key conditions on expires_at_us are written "+ 0" so that the
	-- planner cannot use the (prefix, expires_at_us) cleanup index for them:
	-- on a fresh table without statistics it otherwise prefers that index
	-- and scans every row of the prefix.
	IF p_op <> 1 THEN
		DELETE FROM "{{SCHEMA}}".log AS l WHERE l.prefix = p_prefix AND l.key = p_key AND l.expires_at_us + 0 <= now_us;
	END IF;
	SELECT COALESCE(sum(l.cost), 0), max(l.expires_at_us) INTO v_used, v_last
	FROM "{{SCHEMA}}".log AS l WHERE l.prefix = p_prefix AND l.key = p_key AND l.expires_at_us + 0 > now_us;
	IF p_op = 0 AND NOT duplicate THEN
		allowed := v_used + p_cost <= p_quota;
		IF allowed THEN
			INSERT INTO "{{SCHEMA}}".log (prefix, key, at_us, cost, expires_at_us)
			VALUES (p_prefix, p_key, now_us, p_cost, now_us + p_window_us);
			v_used := v_used + p_cost;
			v_last := now_us + p_window_us;
		END IF;
	ELSIF p_op = 2 AND NOT duplicate THEN
		-- Give back the most recent admissions first.
		v_left := p_cost;
		FOR r IN SELECT l.ctid AS id, l.cost FROM "{{SCHEMA}}".log AS l
			WHERE l.prefix = p_prefix AND l.key = p_key AND l.expires_at_us + 0 > now_us
			ORDER BY l.at_us DESC LOOP
			EXIT WHEN v_left = 0;
			IF r.cost <= v_left THEN
				DELETE FROM "{{SCHEMA}}".log AS l WHERE l.ctid = r.id;
				v_left := v_left - r.cost;
				v_used := v_used - r.cost;
			ELSE
				UPDATE "{{SCHEMA}}".log AS l SET cost = l.cost - v_left WHERE l.ctid = r.id;
				v_used := v_used - v_left;
				v_left := 0;
			END IF;
		END LOOP;
		allowed := true;
	ELSE
		allowed := v_used + p_cost <= p_quota OR duplicate;
	END IF;
	remaining := GREATEST(p_quota - v_used, 0);
	reset_after_us := CASE WHEN v_used > 0 THEN GREATEST(v_last - now_us, 0) ELSE 0 END;
	IF allowed THEN
		retry_after_us := 0;
	ELSE
		-- The earliest expiry after which enough units have left the window.
		SELECT x.expires_at_us INTO v_free FROM (
			SELECT l.expires_at_us, sum(l.cost) OVER (ORDER BY l.expires_at_us, l.at_us ROWS UNBOUNDED PRECEDING) AS freed
			FROM "{{SCHEMA}}".log AS l WHERE l.prefix = p_prefix AND l.key = p_key AND l.expires_at_us + 0 > now_us
		) AS x WHERE v_used - x.freed + p_cost <= p_quota ORDER BY x.expires_at_us LIMIT 1;
		retry_after_us := GREATEST(COALESCE(v_free, v_last) - now_us, 1);
	END IF;
	IF p_op = 0 AND p_idem IS NOT NULL AND NOT allowed THEN
		-- A denied request consumed nothing; forget its idempotency key so a
		-- retry is judged afresh.
		DELETE FROM "{{SCHEMA}}".idempotency AS i WHERE i.prefix = p_prefix AND i.key = p_key AND i.idempotency_key = p_idem;
	ELSIF p_op <> 1 AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- A fresh charge or refund of an idempotency key ends the other
		-- operation's record for it (the records are 't' or 'r' followed by
		-- the caller's key): a retry after a refunded failure is charged
		-- again, and a refund after that charge is not taken for a duplicate.
		DELETE FROM "{{SCHEMA}}".idempotency AS i WHERE i.prefix = p_prefix AND i.key = p_key
			AND i.idempotency_key = (CASE WHEN p_op = 0 THEN '\x72'::bytea ELSE '\x74'::bytea END) || substring(p_idem FROM 2);
	END IF;
	IF p_cleanup > 0 THEN
		-- Only rows that expired more than one window (p_idem_ttl_us) ago:
		-- the row of a key in use is updated in place rather than deleted
		-- and created again at every window.
		PERFORM "{{SCHEMA}}".cleanup(p_prefix, now_us - p_idem_ttl_us, p_cleanup);
	END IF;
	RETURN ARRAY[allowed::int, remaining, retry_after_us, reset_after_us, duplicate::int];
END
$fn$;


-- Composite: several policies over one table set, one decision. Element i
-- of the arrays is policy i (algorithm 1 fixed window, 2 sliding window, 3
-- token bucket, 4 sliding log; the other arguments as for the functions
-- above, p_ttls holding each policy's window). A take or refund first locks
-- every policy's key in one fixed order, by prefix (byte order) and key, so
-- that two composites over the same keys never deadlock: the counter row
-- (created when missing, as lockrow does) or, for the sliding log, the
-- advisory lock. Only then does it read the clock. A take admits only when
-- every policy admits, and then takes from every policy; otherwise it
-- writes nothing. A peek locks nothing and reads the clock after the
-- counters. The idempotency record (p_idem_prefix, p_idem_key, p_idem)
-- covers the whole decision.
--
-- Algorithm 5 is a fixed window over calendar periods. The client computes
-- them with its own clock and passes, in p_bounds[4i-3 .. 4i], four
-- boundaries b0 < b1 < b2 < b3 (microseconds since the epoch): the period
-- that contains its now and its two neighbours. The function picks the one
-- that contains the database's now, so that decisions use one clock, the
-- database's, and calendar arithmetic lives in one place, the client; a
-- database now outside [b0, b3) (clocks more than a period apart) raises
-- SQLSTATE RK001 and decides nothing. The counter row holds the period's
-- start in window_start_us and its end in expires_at_us; a take that
-- starts a new period moves the ended period's count to the usage table.
-- A refund whose idempotency key names a take of this scope gives nothing
-- back to a period that started after that take (the take's time is its
-- record's expiry less p_idem_ttl_us).
--
-- Returns ARRAY[duplicate, then for each policy allowed, remaining,
-- retry_after_us, reset_after_us, period_us (the length of the period
-- counted in, 0 for the other algorithms), used (the units counted in the
-- window or period; quota - remaining for algorithms 2 and 3)].
DROP FUNCTION IF EXISTS "{{SCHEMA}}".composite_unlogged(bigint, bigint[], text[], bytea[], bigint[], bigint[], bigint[], bigint[], bigint[], text, bytea, bytea, bigint, bigint, boolean);
DROP FUNCTION IF EXISTS "{{SCHEMA}}".composite_unlogged(bigint, bigint[], text[], bytea[], bigint[], bigint[], bigint[], bigint[], bigint[], text, bytea, bytea, bigint, bigint, boolean, bigint[]);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".composite_unlogged(
	p_op bigint, p_algs bigint[], p_prefixes text[], p_keys bytea[], p_costs bigint[],
	p_quotas bigint[], p_windows bigint[], p_ttls bigint[], p_locks bigint[],
	p_idem_prefix text, p_idem_key bytea, p_idem bytea, p_idem_ttl_us bigint,
	p_cleanup bigint, p_sync boolean, p_bounds bigint[])
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	n int := cardinality(p_keys);
	now_us bigint;
	i int;
	j int;
	ord int[];
	w bigint;
	lim bigint;
	cst bigint;
	ws bigint;
	tau bigint;
	s_ws bigint[];
	s_a bigint[]; -- count, tat or logged units
	s_b bigint[]; -- prev_count or last log expiry
	s_id tid[]; -- the locked counter row, written by ctid
	s_we bigint[]; -- algorithm 5: the end of the period counted in
	s_pl bigint[]; -- algorithm 5: the length of that period
	s_ows bigint[]; -- algorithm 5: the row's period start and count as read
	s_oa bigint[];
	s_oe bigint[]; -- the row's expires_at_us as locked
	v_id tid;
	v_exp bigint;
	v_pe bigint;
	v_charge bigint;
	b int;
	used bigint;
	ok boolean[];
	all_ok boolean := true;
	allowed boolean;
	duplicate boolean := false;
	v_ws bigint;
	v_a bigint;
	v_b bigint;
	v_room numeric;
	v_elapsed bigint;
	v_left bigint;
	v_free bigint;
	remaining bigint;
	retry_after_us bigint;
	reset_after_us bigint;
	r record;
	o bigint[];
BEGIN
	IF n IS NULL OR n < 1 OR cardinality(p_algs) <> n OR cardinality(p_prefixes) <> n OR cardinality(p_costs) <> n
		OR cardinality(p_quotas) <> n OR cardinality(p_windows) <> n OR cardinality(p_ttls) <> n OR cardinality(p_locks) <> n
		OR cardinality(p_bounds) IS DISTINCT FROM 4 * n THEN
		RAISE EXCEPTION 'ratekit: composite arrays must be non-empty and of equal length' USING ERRCODE = '22023';
	END IF;
	IF p_op <> 1 AND NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	s_ws := array_fill(0::bigint, ARRAY[n]);
	s_a := s_ws;
	s_b := s_ws;
	s_id := array_fill(NULL::tid, ARRAY[n]);
	s_we := s_ws; s_pl := s_ws; s_ows := s_ws; s_oa := s_ws; s_oe := s_ws;
	ok := array_fill(true, ARRAY[n]);
	IF p_op <> 1 THEN
		-- The lock order: by prefix in byte order, then key (an insertion
		-- sort; composites are small).
		ord := ARRAY[1];
		FOR i IN 2..n LOOP
			j := i - 1;
			ord := ord || i;
			WHILE j >= 1 AND (p_prefixes[ord[j]] COLLATE "C" > p_prefixes[i] COLLATE "C"
				OR p_prefixes[ord[j]] = p_prefixes[i] AND p_keys[ord[j]] > p_keys[i]) LOOP
				ord[j + 1] := ord[j];
				j := j - 1;
			END LOOP;
			ord[j + 1] := i;
		END LOOP;
		-- Lock each key and read its state under the lock; a take or a
		-- refund creates a missing row in a state that means the same as no
		-- row. So a refund waits for a take that is creating a key's rows
		-- and sees all of that take or none of it (reading one policy's new
		-- row and not yet another's would refund only part of it), and
		-- idempotency records are touched only under the key's lock (see
		-- the reset function).
		FOREACH i IN ARRAY ord LOOP
			IF p_algs[i] = 4 THEN
				PERFORM pg_advisory_xact_lock(p_locks[i]);
			ELSE
				LOOP
					SELECT c.ctid, c.window_start_us, CASE WHEN p_algs[i] = 3 THEN c.tat_us ELSE c.count END, c.prev_count, c.expires_at_us
					INTO v_id, v_ws, v_a, v_b, v_exp
					FROM "{{SCHEMA}}".counters_unlogged AS c WHERE c.prefix = p_prefixes[i] AND c.key = p_keys[i] FOR UPDATE;
					IF FOUND THEN
						s_id[i] := v_id; s_ws[i] := v_ws; s_a[i] := v_a; s_b[i] := v_b; s_oe[i] := v_exp;
						EXIT;
					END IF;
					INSERT INTO "{{SCHEMA}}".counters_unlogged (prefix, key, expires_at_us) VALUES (p_prefixes[i], p_keys[i], 0)
					ON CONFLICT (prefix, key) DO NOTHING RETURNING ctid INTO v_id;
					IF FOUND THEN
						s_id[i] := v_id;
						EXIT;
					END IF;
				END LOOP;
			END IF;
		END LOOP;
		now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	ELSE
		-- A peek locks nothing. It reads every policy's state in one
		-- statement, so in one snapshot: reading them one statement each
		-- could see a take between two of them and report a state that
		-- never was. The clock is read after the snapshot is taken, so
		-- every decision the peek sees read its clock no later; the logs
		-- are summed at that clock.
		SELECT min(x.now_us), array_agg(x.ws ORDER BY x.i), array_agg(x.a ORDER BY x.i), array_agg(x.b ORDER BY x.i)
		INTO now_us, s_ws, s_a, s_b
		FROM (
			SELECT u.i, t.now_us, COALESCE(c.window_start_us, 0) AS ws,
				CASE u.alg WHEN 4 THEN COALESCE(l.used, 0) WHEN 3 THEN COALESCE(c.tat_us, 0) ELSE COALESCE(c.count, 0) END AS a,
				CASE u.alg WHEN 4 THEN COALESCE(l.last, 0) ELSE COALESCE(c.prev_count, 0) END AS b
			FROM unnest(p_prefixes, p_keys, p_algs) WITH ORDINALITY AS u(prefix, key, alg, i)
			CROSS JOIN (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us OFFSET 0) AS t
			LEFT JOIN "{{SCHEMA}}".counters_unlogged AS c ON u.alg <> 4 AND c.prefix = u.prefix AND c.key = u.key
			LEFT JOIN LATERAL (
				SELECT sum(g.cost)::bigint AS used, max(g.expires_at_us) AS last FROM "{{SCHEMA}}".log_unlogged AS g
				WHERE u.alg = 4 AND g.prefix = u.prefix AND g.key = u.key AND g.expires_at_us + 0 > t.now_us
			) AS l ON true
		) AS x;
	END IF;
	-- Roll each policy's state forward to now (a missing row reads as
	-- zeros, which means the same as no row) and ask whether it would
	-- admit its cost.
	FOR i IN 1..n LOOP
		w := p_windows[i]; lim := p_quotas[i]; cst := p_costs[i];
		IF p_op = 0 AND (cst < 1 OR cst > lim) THEN
			RAISE EXCEPTION 'ratekit: cost % of policy % is outside 1..%', cst, i, lim USING ERRCODE = '22023';
		END IF;
		CASE p_algs[i]
		WHEN 1 THEN
			ws := now_us - now_us % w;
			IF s_ws[i] < ws THEN
				s_ws[i] := ws; s_a[i] := 0;
			END IF;
			ok[i] := s_a[i] + cst <= lim;
		WHEN 5 THEN
			b := 4 * (i - 1);
			IF now_us >= p_bounds[b + 1] AND now_us < p_bounds[b + 2] THEN
				ws := p_bounds[b + 1]; v_pe := p_bounds[b + 2];
			ELSIF now_us >= p_bounds[b + 2] AND now_us < p_bounds[b + 3] THEN
				ws := p_bounds[b + 2]; v_pe := p_bounds[b + 3];
			ELSIF now_us >= p_bounds[b + 3] AND now_us < p_bounds[b + 4] THEN
				ws := p_bounds[b + 3]; v_pe := p_bounds[b + 4];
			ELSE
				RAISE EXCEPTION 'ratekit: clock skew: the database clock (% µs since the Unix epoch) is outside the periods [%, %) that the client computed for policy %: the clocks differ by more than a period',
					now_us, p_bounds[b + 1], p_bounds[b + 4], p_prefixes[i] USING ERRCODE = 'RK001';
			END IF;
			s_ows[i] := s_ws[i]; s_oa[i] := s_a[i];
			s_we[i] := v_pe; s_pl[i] := v_pe - ws;
			-- A row of an earlier period counts from zero; a row whose
			-- period started later (the key's anchor moved back) keeps its
			-- count: a change of period never grants a fresh one.
			IF s_ws[i] < ws THEN
				s_ws[i] := ws; s_a[i] := 0;
			END IF;
			ok[i] := s_a[i] + cst <= lim;
		WHEN 2 THEN
			ws := now_us - now_us % w;
			IF s_ws[i] < ws THEN
				s_b[i] := CASE WHEN s_ws[i] = ws - w THEN s_a[i] ELSE 0 END;
				s_a[i] := 0;
				s_ws[i] := ws;
			END IF;
			ok[i] := lim::numeric * w - s_b[i]::numeric * (w - GREATEST(now_us - s_ws[i], 0)) - s_a[i]::numeric * w >= cst::numeric * w;
		WHEN 3 THEN
			s_a[i] := GREATEST(s_a[i], now_us);
			ok[i] := s_a[i] + cst * w - now_us <= lim * w;
		ELSE
			IF p_op <> 1 THEN
				DELETE FROM "{{SCHEMA}}".log_unlogged AS l WHERE l.prefix = p_prefixes[i] AND l.key = p_keys[i] AND l.expires_at_us + 0 <= now_us;
				SELECT COALESCE(sum(l.cost), 0), COALESCE(max(l.expires_at_us), 0) INTO v_a, v_b
				FROM "{{SCHEMA}}".log_unlogged AS l WHERE l.prefix = p_prefixes[i] AND l.key = p_keys[i] AND l.expires_at_us + 0 > now_us;
				s_a[i] := v_a; s_b[i] := v_b;
			END IF;
			ok[i] := s_a[i] + cst <= lim;
		END CASE;
		all_ok := all_ok AND ok[i];
	END LOOP;
	IF p_op <> 1 AND p_idem IS NOT NULL THEN
		INSERT INTO "{{SCHEMA}}".idempotency_unlogged AS x (prefix, key, idempotency_key, expires_at_us)
		VALUES (p_idem_prefix, p_idem_key, p_idem, now_us + p_idem_ttl_us)
		ON CONFLICT (prefix, key, idempotency_key) DO UPDATE SET expires_at_us = EXCLUDED.expires_at_us
		WHERE x.expires_at_us <= now_us;
		duplicate := NOT FOUND;
	END IF;
	IF p_op = 2 AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- When the take this refund undoes is on record, its time.
		SELECT x.expires_at_us - p_idem_ttl_us INTO v_charge FROM "{{SCHEMA}}".idempotency_unlogged AS x
		WHERE x.prefix = p_idem_prefix AND x.key = p_idem_key
			AND x.idempotency_key = set_byte(p_idem, 0, get_byte(p_idem, 0) + 2) AND x.expires_at_us > now_us;
	END IF;
	IF p_op = 0 AND NOT duplicate AND all_ok THEN
		FOR i IN 1..n LOOP
			w := p_windows[i]; lim := p_quotas[i]; cst := p_costs[i];
			CASE p_algs[i]
			WHEN 1 THEN
				s_a[i] := s_a[i] + cst;
				UPDATE "{{SCHEMA}}".counters_unlogged AS c SET window_start_us = s_ws[i], count = s_a[i],
					expires_at_us = GREATEST(c.expires_at_us, s_ws[i] + w)
				WHERE c.ctid = s_id[i];
			WHEN 5 THEN
				s_a[i] := s_a[i] + cst;
				IF s_ows[i] < s_ws[i] AND s_oa[i] > 0 THEN
					INSERT INTO "{{SCHEMA}}".period_usage_unlogged AS u (prefix, key, period_start_us, period_end_us, used)
					VALUES (p_prefixes[i], p_keys[i], s_ows[i], s_oe[i], s_oa[i])
					ON CONFLICT (prefix, period_start_us, key) DO UPDATE SET used = u.used + EXCLUDED.used,
						period_end_us = GREATEST(u.period_end_us, EXCLUDED.period_end_us);
				END IF;
				UPDATE "{{SCHEMA}}".counters_unlogged AS c SET window_start_us = s_ws[i], count = s_a[i],
					expires_at_us = GREATEST(c.expires_at_us, s_we[i])
				WHERE c.ctid = s_id[i];
			WHEN 2 THEN
				s_a[i] := s_a[i] + cst;
				UPDATE "{{SCHEMA}}".counters_unlogged AS c SET window_start_us = s_ws[i], count = s_a[i], prev_count = s_b[i],
					expires_at_us = GREATEST(c.expires_at_us, s_ws[i] + 2 * w)
				WHERE c.ctid = s_id[i];
			WHEN 3 THEN
				tau := lim * w;
				s_a[i] := s_a[i] + cst * w;
				UPDATE "{{SCHEMA}}".counters_unlogged AS c SET tat_us = s_a[i],
					expires_at_us = GREATEST(c.expires_at_us, (s_a[i] / tau + 1) * tau)
				WHERE c.ctid = s_id[i];
			ELSE
				INSERT INTO "{{SCHEMA}}".log_unlogged (prefix, key, at_us, cost, expires_at_us)
				VALUES (p_prefixes[i], p_keys[i], now_us, cst, now_us + w);
				s_a[i] := s_a[i] + cst;
				s_b[i] := GREATEST(s_b[i], now_us + w);
			END CASE;
		END LOOP;
	ELSIF p_op = 2 AND NOT duplicate THEN
		FOR i IN 1..n LOOP
			w := p_windows[i]; cst := p_costs[i];
			CASE p_algs[i]
			WHEN 1 THEN
				IF s_a[i] > 0 THEN
					s_a[i] := GREATEST(s_a[i] - cst, 0);
					UPDATE "{{SCHEMA}}".counters_unlogged AS c SET count = s_a[i] WHERE c.ctid = s_id[i];
				END IF;
			WHEN 5 THEN
				IF s_a[i] > 0 AND (v_charge IS NULL OR v_charge >= s_ws[i]) THEN
					s_a[i] := GREATEST(s_a[i] - cst, 0);
					UPDATE "{{SCHEMA}}".counters_unlogged AS c SET count = s_a[i] WHERE c.ctid = s_id[i];
				END IF;
			WHEN 2 THEN
				IF s_a[i] > 0 OR s_b[i] > 0 THEN
					s_b[i] := GREATEST(s_b[i] - GREATEST(cst - s_a[i], 0), 0);
					s_a[i] := GREATEST(s_a[i] - cst, 0);
					UPDATE "{{SCHEMA}}".counters_unlogged AS c SET window_start_us = s_ws[i], count = s_a[i], prev_count = s_b[i]
					WHERE c.ctid = s_id[i];
				END IF;
			WHEN 3 THEN
				IF s_a[i] > now_us THEN
					s_a[i] := GREATEST(s_a[i] - cst * w, now_us);
					UPDATE "{{SCHEMA}}".counters_unlogged AS c SET tat_us = s_a[i] WHERE c.ctid = s_id[i];
				END IF;
			ELSE
				-- Give back the most recent admissions first.
				v_left := cst;
				FOR r IN SELECT l.ctid AS id, l.cost FROM "{{SCHEMA}}".log_unlogged AS l
					WHERE l.prefix = p_prefixes[i] AND l.key = p_keys[i] AND l.expires_at_us + 0 > now_us
					ORDER BY l.at_us DESC LOOP
					EXIT WHEN v_left = 0;
					IF r.cost <= v_left THEN
						DELETE FROM "{{SCHEMA}}".log_unlogged AS l WHERE l.ctid = r.id;
						v_left := v_left - r.cost;
						s_a[i] := s_a[i] - r.cost;
					ELSE
						UPDATE "{{SCHEMA}}".log_unlogged AS l SET cost = l.cost - v_left WHERE l.ctid = r.id;
						s_a[i] := s_a[i] - v_left;
						v_left := 0;
					END IF;
				END LOOP;
			END CASE;
		END LOOP;
	END IF;
	o := ARRAY[duplicate::int::bigint];
	FOR i IN 1..n LOOP
		w := p_windows[i]; lim := p_quotas[i]; cst := p_costs[i];
		allowed := p_op = 2 OR duplicate OR ok[i];
		CASE p_algs[i]
		WHEN 1 THEN
			remaining := GREATEST(lim - s_a[i], 0);
			reset_after_us := GREATEST(s_ws[i] + w - now_us, 0);
			retry_after_us := CASE WHEN allowed THEN 0 ELSE reset_after_us END;
		WHEN 5 THEN
			remaining := GREATEST(lim - s_a[i], 0);
			reset_after_us := GREATEST(s_we[i] - now_us, 0);
			retry_after_us := CASE WHEN allowed THEN 0 ELSE reset_after_us END;
		WHEN 2 THEN
			v_ws := s_ws[i]; v_a := s_a[i]; v_b := s_b[i];
			v_elapsed := GREATEST(now_us - v_ws, 0);
			v_room := lim::numeric * w - v_b::numeric * (w - v_elapsed) - v_a::numeric * w;
			remaining := GREATEST(div(v_room, w), 0)::bigint;
			reset_after_us := CASE
				WHEN v_a > 0 THEN v_ws + 2 * w - now_us
				WHEN v_b > 0 THEN v_ws + w - now_us
				ELSE 0 END;
			IF allowed THEN
				retry_after_us := 0;
			ELSIF v_a + cst <= lim THEN
				retry_after_us := GREATEST(ceil(w - (lim - v_a - cst)::numeric * w / v_b)::bigint - v_elapsed, 1);
			ELSE
				retry_after_us := (v_ws + w - now_us) + GREATEST(ceil(w - (lim - cst)::numeric * w / v_a)::bigint, 0);
			END IF;
		WHEN 3 THEN
			tau := lim * w;
			remaining := GREATEST((tau - (s_a[i] - now_us)) / w, 0);
			reset_after_us := s_a[i] - now_us;
			retry_after_us := CASE WHEN allowed THEN 0 ELSE GREATEST(s_a[i] + cst * w - tau - now_us, 1) END;
		ELSE
			remaining := GREATEST(lim - s_a[i], 0);
			reset_after_us := CASE WHEN s_a[i] > 0 THEN GREATEST(s_b[i] - now_us, 0) ELSE 0 END;
			IF allowed THEN
				retry_after_us := 0;
			ELSE
				v_free := NULL;
				SELECT x.expires_at_us INTO v_free FROM (
					SELECT l.expires_at_us, sum(l.cost) OVER (ORDER BY l.expires_at_us, l.at_us ROWS UNBOUNDED PRECEDING) AS freed
					FROM "{{SCHEMA}}".log_unlogged AS l WHERE l.prefix = p_prefixes[i] AND l.key = p_keys[i] AND l.expires_at_us + 0 > now_us
				) AS x WHERE s_a[i] - x.freed + cst <= lim ORDER BY x.expires_at_us LIMIT 1;
				retry_after_us := GREATEST(COALESCE(v_free, s_b[i]) - now_us, 1);
			END IF;
		END CASE;
		used := CASE WHEN p_algs[i] IN (2, 3) THEN lim - remaining ELSE s_a[i] END;
		o := o || ARRAY[allowed::int::bigint, remaining, retry_after_us, reset_after_us, s_pl[i], used];
	END LOOP;
	IF p_op = 0 AND p_idem IS NOT NULL AND NOT duplicate AND NOT all_ok THEN
		-- A denied request consumed nothing; forget its idempotency key so a
		-- retry is judged afresh.
		DELETE FROM "{{SCHEMA}}".idempotency_unlogged AS x WHERE x.prefix = p_idem_prefix AND x.key = p_idem_key AND x.idempotency_key = p_idem;
	ELSIF p_op <> 1 AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- A fresh charge ends the refund record of the same idempotency key
		-- and a fresh refund the charge record (their first bytes differ).
		DELETE FROM "{{SCHEMA}}".idempotency_unlogged AS x WHERE x.prefix = p_idem_prefix AND x.key = p_idem_key
			AND x.idempotency_key = set_byte(p_idem, 0, CASE WHEN p_op = 0 THEN get_byte(p_idem, 0) - 2 ELSE get_byte(p_idem, 0) + 2 END);
	END IF;
	IF p_cleanup > 0 THEN
		FOR i IN 1..n LOOP
			PERFORM "{{SCHEMA}}".cleanup_unlogged(p_prefixes[i], now_us - p_ttls[i], p_cleanup);
		END LOOP;
	END IF;
	RETURN o;
END
$fn$;

-- Reset: forget p_key under each of p_prefixes (counter rows, log entries,
-- idempotency records). It first takes the locks a take of the same keys
-- takes, in the same order (prefix in byte order; the advisory lock for a
-- sliding log, p_algs[i] = 4, the counter row otherwise), and deletes only
-- then: every transaction that locks more than one of these rows locks them
-- in that order, so a reset racing takes and refunds of its key cannot
-- deadlock with them. It returns the rows deleted.
DROP FUNCTION IF EXISTS "{{SCHEMA}}".reset_unlogged(text[], bytea, bigint[], bigint[]);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".reset_unlogged(p_prefixes text[], p_key bytea, p_algs bigint[], p_locks bigint[])
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	i bigint;
	a bigint;
	b bigint;
	c bigint;
BEGIN
	IF coalesce(cardinality(p_prefixes), 0) < 1 OR cardinality(p_algs) IS DISTINCT FROM cardinality(p_prefixes)
		OR cardinality(p_locks) IS DISTINCT FROM cardinality(p_prefixes) THEN
		RAISE EXCEPTION 'ratekit: reset arrays must be non-empty and of equal length' USING ERRCODE = '22023';
	END IF;
	FOR i IN SELECT u.o FROM unnest(p_prefixes) WITH ORDINALITY AS u(p, o) ORDER BY u.p COLLATE "C", u.o LOOP
		IF p_algs[i] = 4 THEN
			PERFORM pg_advisory_xact_lock(p_locks[i]);
		ELSE
			-- A missing row is created, as a take creates it, so that a take
			-- that would create it waits for the reset too; it is deleted
			-- below with the rest.
			LOOP
				PERFORM 1 FROM "{{SCHEMA}}".counters_unlogged AS x WHERE x.prefix = p_prefixes[i] AND x.key = p_key FOR UPDATE;
				EXIT WHEN FOUND;
				INSERT INTO "{{SCHEMA}}".counters_unlogged (prefix, key, expires_at_us) VALUES (p_prefixes[i], p_key, 0)
				ON CONFLICT (prefix, key) DO NOTHING;
				EXIT WHEN FOUND;
			END LOOP;
		END IF;
	END LOOP;
	DELETE FROM "{{SCHEMA}}".counters_unlogged AS x WHERE x.prefix = ANY (p_prefixes) AND x.key = p_key;
	GET DIAGNOSTICS a = ROW_COUNT;
	DELETE FROM "{{SCHEMA}}".log_unlogged AS x WHERE x.prefix = ANY (p_prefixes) AND x.key = p_key;
	GET DIAGNOSTICS b = ROW_COUNT;
	DELETE FROM "{{SCHEMA}}".idempotency_unlogged AS x WHERE x.prefix = ANY (p_prefixes) AND x.key = p_key;
	GET DIAGNOSTICS c = ROW_COUNT;
	RETURN a + b + c;
END
$fn$;

-- Composite: several policies over one table set, one decision. Element i
-- of the arrays is policy i (algorithm 1 fixed window, 2 sliding window, 3
-- token bucket, 4 sliding log; the other arguments as for the functions
-- above, p_ttls holding each policy's window). A take or refund first locks
-- every policy's key in one fixed order, by prefix (byte order) and key, so
-- that two composites over the same keys never deadlock: the counter row
-- (created when missing, as lockrow does) or, for the sliding log, the
-- advisory lock. Only then does it read the clock. A take admits only when
-- every policy admits, and then takes from every policy; otherwise it
-- writes nothing. A peek locks nothing and reads the clock after the
-- counters. The idempotency record (p_idem_prefix, p_idem_key, p_idem)
-- covers the whole decision.
--
-- Algorithm 5 is a fixed window over calendar periods. The client computes
-- them with its own clock and passes, in p_bounds[4i-3 .. 4i], four
-- boundaries b0 < b1 < b2 < b3 (microseconds since the epoch): the period
-- that contains its now and its two neighbours. The function picks the one
-- that contains the database's now, so that decisions use one clock, the
-- database's, and calendar arithmetic lives in one place, the client; a
-- database now outside [b0, b3) (clocks more than a period apart) raises
-- SQLSTATE RK001 and decides nothing. The counter row holds the period's
-- start in window_start_us and its end in expires_at_us; a take that
-- starts a new period moves the ended period's count to the usage table.
-- A refund whose idempotency key names a take of this scope gives nothing
-- back to a period that started after that take (the take's time is its
-- record's expiry less p_idem_ttl_us).
--
-- Returns ARRAY[duplicate, then for each policy allowed, remaining,
-- retry_after_us, reset_after_us, period_us (the length of the period
-- counted in, 0 for the other algorithms), used (the units counted in the
-- window or period; quota - remaining for algorithms 2 and 3)].
DROP FUNCTION IF EXISTS "{{SCHEMA}}".composite(bigint, bigint[], text[], bytea[], bigint[], bigint[], bigint[], bigint[], bigint[], text, bytea, bytea, bigint, bigint, boolean);
DROP FUNCTION IF EXISTS "{{SCHEMA}}".composite(bigint, bigint[], text[], bytea[], bigint[], bigint[], bigint[], bigint[], bigint[], text, bytea, bytea, bigint, bigint, boolean, bigint[]);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".composite(
	p_op bigint, p_algs bigint[], p_prefixes text[], p_keys bytea[], p_costs bigint[],
	p_quotas bigint[], p_windows bigint[], p_ttls bigint[], p_locks bigint[],
	p_idem_prefix text, p_idem_key bytea, p_idem bytea, p_idem_ttl_us bigint,
	p_cleanup bigint, p_sync boolean, p_bounds bigint[])
RETURNS bigint[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	n int := cardinality(p_keys);
	now_us bigint;
	i int;
	j int;
	ord int[];
	w bigint;
	lim bigint;
	cst bigint;
	ws bigint;
	tau bigint;
	s_ws bigint[];
	s_a bigint[]; -- count, tat or logged units
	s_b bigint[]; -- prev_count or last log expiry
	s_id tid[]; -- the locked counter row, written by ctid
	s_we bigint[]; -- algorithm 5: the end of the period counted in
	s_pl bigint[]; -- algorithm 5: the length of that period
	s_ows bigint[]; -- algorithm 5: the row's period start and count as read
	s_oa bigint[];
	s_oe bigint[]; -- the row's expires_at_us as locked
	v_id tid;
	v_exp bigint;
	v_pe bigint;
	v_charge bigint;
	b int;
	used bigint;
	ok boolean[];
	all_ok boolean := true;
	allowed boolean;
	duplicate boolean := false;
	v_ws bigint;
	v_a bigint;
	v_b bigint;
	v_room numeric;
	v_elapsed bigint;
	v_left bigint;
	v_free bigint;
	remaining bigint;
	retry_after_us bigint;
	reset_after_us bigint;
	r record;
	o bigint[];
BEGIN
	IF n IS NULL OR n < 1 OR cardinality(p_algs) <> n OR cardinality(p_prefixes) <> n OR cardinality(p_costs) <> n
		OR cardinality(p_quotas) <> n OR cardinality(p_windows) <> n OR cardinality(p_ttls) <> n OR cardinality(p_locks) <> n
		OR cardinality(p_bounds) IS DISTINCT FROM 4 * n THEN
		RAISE EXCEPTION 'ratekit: composite arrays must be non-empty and of equal length' USING ERRCODE = '22023';
	END IF;
	IF p_op <> 1 AND NOT p_sync THEN
		PERFORM set_config('synchronous_commit', 'off', true);
	END IF;
	s_ws := array_fill(0::bigint, ARRAY[n]);
	s_a := s_ws;
	s_b := s_ws;
	s_id := array_fill(NULL::tid, ARRAY[n]);
	s_we := s_ws; s_pl := s_ws; s_ows := s_ws; s_oa := s_ws; s_oe := s_ws;
	ok := array_fill(true, ARRAY[n]);
	IF p_op <> 1 THEN
		-- The lock order: by prefix in byte order, then key (an insertion
		-- sort; composites are small).
		ord := ARRAY[1];
		FOR i IN 2..n LOOP
			j := i - 1;
			ord := ord || i;
			WHILE j >= 1 AND (p_prefixes[ord[j]] COLLATE "C" > p_prefixes[i] COLLATE "C"
				OR p_prefixes[ord[j]] = p_prefixes[i] AND p_keys[ord[j]] > p_keys[i]) LOOP
				ord[j + 1] := ord[j];
				j := j - 1;
			END LOOP;
			ord[j + 1] := i;
		END LOOP;
		-- Lock each key and read its state under the lock; a take or a
		-- refund creates a missing row in a state that means the same as no
		-- row. So a refund waits for a take that is creating a key's rows
		-- and sees all of that take or none of it (reading one policy's new
		-- row and not yet another's would refund only part of it), and
		-- idempotency records are touched only under the key's lock (see
		-- the reset function).
		FOREACH i IN ARRAY ord LOOP
			IF p_algs[i] = 4 THEN
				PERFORM pg_advisory_xact_lock(p_locks[i]);
			ELSE
				LOOP
					SELECT c.ctid, c.window_start_us, CASE WHEN p_algs[i] = 3 THEN c.tat_us ELSE c.count END, c.prev_count, c.expires_at_us
					INTO v_id, v_ws, v_a, v_b, v_exp
					FROM "{{SCHEMA}}".counters AS c WHERE c.prefix = p_prefixes[i] AND c.key = p_keys[i] FOR UPDATE;
					IF FOUND THEN
						s_id[i] := v_id; s_ws[i] := v_ws; s_a[i] := v_a; s_b[i] := v_b; s_oe[i] := v_exp;
						EXIT;
					END IF;
					INSERT INTO "{{SCHEMA}}".counters (prefix, key, expires_at_us) VALUES (p_prefixes[i], p_keys[i], 0)
					ON CONFLICT (prefix, key) DO NOTHING RETURNING ctid INTO v_id;
					IF FOUND THEN
						s_id[i] := v_id;
						EXIT;
					END IF;
				END LOOP;
			END IF;
		END LOOP;
		now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	ELSE
		-- A peek locks nothing. It reads every policy's state in one
		-- statement, so in one snapshot: reading them one statement each
		-- could see a take between two of them and report a state that
		-- never was. The clock is read after the snapshot is taken, so
		-- every decision the peek sees read its clock no later; the logs
		-- are summed at that clock.
		SELECT min(x.now_us), array_agg(x.ws ORDER BY x.i), array_agg(x.a ORDER BY x.i), array_agg(x.b ORDER BY x.i)
		INTO now_us, s_ws, s_a, s_b
		FROM (
			SELECT u.i, t.now_us, COALESCE(c.window_start_us, 0) AS ws,
				CASE u.alg WHEN 4 THEN COALESCE(l.used, 0) WHEN 3 THEN COALESCE(c.tat_us, 0) ELSE COALESCE(c.count, 0) END AS a,
				CASE u.alg WHEN 4 THEN COALESCE(l.last, 0) ELSE COALESCE(c.prev_count, 0) END AS b
			FROM unnest(p_prefixes, p_keys, p_algs) WITH ORDINALITY AS u(prefix, key, alg, i)
			CROSS JOIN (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us OFFSET 0) AS t
			LEFT JOIN "{{SCHEMA}}".counters AS c ON u.alg <> 4 AND c.prefix = u.prefix AND c.key = u.key
			LEFT JOIN LATERAL (
				SELECT sum(g.cost)::bigint AS used, max(g.expires_at_us) AS last FROM "{{SCHEMA}}".log AS g
				WHERE u.alg = 4 AND g.prefix = u.prefix AND g.key = u.key AND g.expires_at_us + 0 > t.now_us
			) AS l ON true
		) AS x;
	END IF;
	-- Roll each policy's state forward to now (a missing row reads as
	-- zeros, which means the same as no row) and ask whether it would
	-- admit its cost.
	FOR i IN 1..n LOOP
		w := p_windows[i]; lim := p_quotas[i]; cst := p_costs[i];
		IF p_op = 0 AND (cst < 1 OR cst > lim) THEN
			RAISE EXCEPTION 'ratekit: cost % of policy % is outside 1..%', cst, i, lim USING ERRCODE = '22023';
		END IF;
		CASE p_algs[i]
		WHEN 1 THEN
			ws := now_us - now_us % w;
			IF s_ws[i] < ws THEN
				s_ws[i] := ws; s_a[i] := 0;
			END IF;
			ok[i] := s_a[i] + cst <= lim;
		WHEN 5 THEN
			b := 4 * (i - 1);
			IF now_us >= p_bounds[b + 1] AND now_us < p_bounds[b + 2] THEN
				ws := p_bounds[b + 1]; v_pe := p_bounds[b + 2];
			ELSIF now_us >= p_bounds[b + 2] AND now_us < p_bounds[b + 3] THEN
				ws := p_bounds[b + 2]; v_pe := p_bounds[b + 3];
			ELSIF now_us >= p_bounds[b + 3] AND now_us < p_bounds[b + 4] THEN
				ws := p_bounds[b + 3]; v_pe := p_bounds[b + 4];
			ELSE
				RAISE EXCEPTION 'ratekit: clock skew: the database clock (% µs since the Unix epoch) is outside the periods [%, %) that the client computed for policy %: the clocks differ by more than a period',
					now_us, p_bounds[b + 1], p_bounds[b + 4], p_prefixes[i] USING ERRCODE = 'RK001';
			END IF;
			s_ows[i] := s_ws[i]; s_oa[i] := s_a[i];
			s_we[i] := v_pe; s_pl[i] := v_pe - ws;
			-- A row of an earlier period counts from zero; a row whose
			-- period started later (the key's anchor moved back) keeps its
			-- count: a change of period never grants a fresh one.
			IF s_ws[i] < ws THEN
				s_ws[i] := ws; s_a[i] := 0;
			END IF;
			ok[i] := s_a[i] + cst <= lim;
		WHEN 2 THEN
			ws := now_us - now_us % w;
			IF s_ws[i] < ws THEN
				s_b[i] := CASE WHEN s_ws[i] = ws - w THEN s_a[i] ELSE 0 END;
				s_a[i] := 0;
				s_ws[i] := ws;
			END IF;
			ok[i] := lim::numeric * w - s_b[i]::numeric * (w - GREATEST(now_us - s_ws[i], 0)) - s_a[i]::numeric * w >= cst::numeric * w;
		WHEN 3 THEN
			s_a[i] := GREATEST(s_a[i], now_us);
			ok[i] := s_a[i] + cst * w - now_us <= lim * w;
		ELSE
			IF p_op <> 1 THEN
				DELETE FROM "{{SCHEMA}}".log AS l WHERE l.prefix = p_prefixes[i] AND l.key = p_keys[i] AND l.expires_at_us + 0 <= now_us;
				SELECT COALESCE(sum(l.cost), 0), COALESCE(max(l.expires_at_us), 0) INTO v_a, v_b
				FROM "{{SCHEMA}}".log AS l WHERE l.prefix = p_prefixes[i] AND l.key = p_keys[i] AND l.expires_at_us + 0 > now_us;
				s_a[i] := v_a; s_b[i] := v_b;
			END IF;
			ok[i] := s_a[i] + cst <= lim;
		END CASE;
		all_ok := all_ok AND ok[i];
	END LOOP;
	IF p_op <> 1 AND p_idem IS NOT NULL THEN
		INSERT INTO "{{SCHEMA}}".idempotency AS x (prefix, key, idempotency_key, expires_at_us)
		VALUES (p_idem_prefix, p_idem_key, p_idem, now_us + p_idem_ttl_us)
		ON CONFLICT (prefix, key, idempotency_key) DO UPDATE SET expires_at_us = EXCLUDED.expires_at_us
		WHERE x.expires_at_us <= now_us;
		duplicate := NOT FOUND;
	END IF;
	IF p_op = 2 AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- When the take this refund undoes is on record, its time.
		SELECT x.expires_at_us - p_idem_ttl_us INTO v_charge FROM "{{SCHEMA}}".idempotency AS x
		WHERE x.prefix = p_idem_prefix AND x.key = p_idem_key
			AND x.idempotency_key = set_byte(p_idem, 0, get_byte(p_idem, 0) + 2) AND x.expires_at_us > now_us;
	END IF;
	IF p_op = 0 AND NOT duplicate AND all_ok THEN
		FOR i IN 1..n LOOP
			w := p_windows[i]; lim := p_quotas[i]; cst := p_costs[i];
			CASE p_algs[i]
			WHEN 1 THEN
				s_a[i] := s_a[i] + cst;
				UPDATE "{{SCHEMA}}".counters AS c SET window_start_us = s_ws[i], count = s_a[i],
					expires_at_us = GREATEST(c.expires_at_us, s_ws[i] + w)
				WHERE c.ctid = s_id[i];
			WHEN 5 THEN
				s_a[i] := s_a[i] + cst;
				IF s_ows[i] < s_ws[i] AND s_oa[i] > 0 THEN
					INSERT INTO "{{SCHEMA}}".period_usage AS u (prefix, key, period_start_us, period_end_us, used)
					VALUES (p_prefixes[i], p_keys[i], s_ows[i], s_oe[i], s_oa[i])
					ON CONFLICT (prefix, period_start_us, key) DO UPDATE SET used = u.used + EXCLUDED.used,
						period_end_us = GREATEST(u.period_end_us, EXCLUDED.period_end_us);
				END IF;
				UPDATE "{{SCHEMA}}".counters AS c SET window_start_us = s_ws[i], count = s_a[i],
					expires_at_us = GREATEST(c.expires_at_us, s_we[i])
				WHERE c.ctid = s_id[i];
			WHEN 2 THEN
				s_a[i] := s_a[i] + cst;
				UPDATE "{{SCHEMA}}".counters AS c SET window_start_us = s_ws[i], count = s_a[i], prev_count = s_b[i],
					expires_at_us = GREATEST(c.expires_at_us, s_ws[i] + 2 * w)
				WHERE c.ctid = s_id[i];
			WHEN 3 THEN
				tau := lim * w;
				s_a[i] := s_a[i] + cst * w;
				UPDATE "{{SCHEMA}}".counters AS c SET tat_us = s_a[i],
					expires_at_us = GREATEST(c.expires_at_us, (s_a[i] / tau + 1) * tau)
				WHERE c.ctid = s_id[i];
			ELSE
				INSERT INTO "{{SCHEMA}}".log (prefix, key, at_us, cost, expires_at_us)
				VALUES (p_prefixes[i], p_keys[i], now_us, cst, now_us + w);
				s_a[i] := s_a[i] + cst;
				s_b[i] := GREATEST(s_b[i], now_us + w);
			END CASE;
		END LOOP;
	ELSIF p_op = 2 AND NOT duplicate THEN
		FOR i IN 1..n LOOP
			w := p_windows[i]; cst := p_costs[i];
			CASE p_algs[i]
			WHEN 1 THEN
				IF s_a[i] > 0 THEN
					s_a[i] := GREATEST(s_a[i] - cst, 0);
					UPDATE "{{SCHEMA}}".counters AS c SET count = s_a[i] WHERE c.ctid = s_id[i];
				END IF;
			WHEN 5 THEN
				IF s_a[i] > 0 AND (v_charge IS NULL OR v_charge >= s_ws[i]) THEN
					s_a[i] := GREATEST(s_a[i] - cst, 0);
					UPDATE "{{SCHEMA}}".counters AS c SET count = s_a[i] WHERE c.ctid = s_id[i];
				END IF;
			WHEN 2 THEN
				IF s_a[i] > 0 OR s_b[i] > 0 THEN
					s_b[i] := GREATEST(s_b[i] - GREATEST(cst - s_a[i], 0), 0);
					s_a[i] := GREATEST(s_a[i] - cst, 0);
					UPDATE "{{SCHEMA}}".counters AS c SET window_start_us = s_ws[i], count = s_a[i], prev_count = s_b[i]
					WHERE c.ctid = s_id[i];
				END IF;
			WHEN 3 THEN
				IF s_a[i] > now_us THEN
					s_a[i] := GREATEST(s_a[i] - cst * w, now_us);
					UPDATE "{{SCHEMA}}".counters AS c SET tat_us = s_a[i] WHERE c.ctid = s_id[i];
				END IF;
			ELSE
				-- Give back the most recent admissions first.
				v_left := cst;
				FOR r IN SELECT l.ctid AS id, l.cost FROM "{{SCHEMA}}".log AS l
					WHERE l.prefix = p_prefixes[i] AND l.key = p_keys[i] AND l.expires_at_us + 0 > now_us
					ORDER BY l.at_us DESC LOOP
					EXIT WHEN v_left = 0;
					IF r.cost <= v_left THEN
						DELETE FROM "{{SCHEMA}}".log AS l WHERE l.ctid = r.id;
						v_left := v_left - r.cost;
						s_a[i] := s_a[i] - r.cost;
					ELSE
						UPDATE "{{SCHEMA}}".log AS l SET cost = l.cost - v_left WHERE l.ctid = r.id;
						s_a[i] := s_a[i] - v_left;
						v_left := 0;
					END IF;
				END LOOP;
			END CASE;
		END LOOP;
	END IF;
	o := ARRAY[duplicate::int::bigint];
	FOR i IN 1..n LOOP
		w := p_windows[i]; lim := p_quotas[i]; cst := p_costs[i];
		allowed := p_op = 2 OR duplicate OR ok[i];
		CASE p_algs[i]
		WHEN 1 THEN
			remaining := GREATEST(lim - s_a[i], 0);
			reset_after_us := GREATEST(s_ws[i] + w - now_us, 0);
			retry_after_us := CASE WHEN allowed THEN 0 ELSE reset_after_us END;
		WHEN 5 THEN
			remaining := GREATEST(lim - s_a[i], 0);
			reset_after_us := GREATEST(s_we[i] - now_us, 0);
			retry_after_us := CASE WHEN allowed THEN 0 ELSE reset_after_us END;
		WHEN 2 THEN
			v_ws := s_ws[i]; v_a := s_a[i]; v_b := s_b[i];
			v_elapsed := GREATEST(now_us - v_ws, 0);
			v_room := lim::numeric * w - v_b::numeric * (w - v_elapsed) - v_a::numeric * w;
			remaining := GREATEST(div(v_room, w), 0)::bigint;
			reset_after_us := CASE
				WHEN v_a > 0 THEN v_ws + 2 * w - now_us
				WHEN v_b > 0 THEN v_ws + w - now_us
				ELSE 0 END;
			IF allowed THEN
				retry_after_us := 0;
			ELSIF v_a + cst <= lim THEN
				retry_after_us := GREATEST(ceil(w - (lim - v_a - cst)::numeric * w / v_b)::bigint - v_elapsed, 1);
			ELSE
				retry_after_us := (v_ws + w - now_us) + GREATEST(ceil(w - (lim - cst)::numeric * w / v_a)::bigint, 0);
			END IF;
		WHEN 3 THEN
			tau := lim * w;
			remaining := GREATEST((tau - (s_a[i] - now_us)) / w, 0);
			reset_after_us := s_a[i] - now_us;
			retry_after_us := CASE WHEN allowed THEN 0 ELSE GREATEST(s_a[i] + cst * w - tau - now_us, 1) END;
		ELSE
			remaining := GREATEST(lim - s_a[i], 0);
			reset_after_us := CASE WHEN s_a[i] > 0 THEN GREATEST(s_b[i] - now_us, 0) ELSE 0 END;
			IF allowed THEN
				retry_after_us := 0;
			ELSE
				v_free := NULL;
				SELECT x.expires_at_us INTO v_free FROM (
					SELECT l.expires_at_us, sum(l.cost) OVER (ORDER BY l.expires_at_us, l.at_us ROWS UNBOUNDED PRECEDING) AS freed
					FROM "{{SCHEMA}}".log AS l WHERE l.prefix = p_prefixes[i] AND l.key = p_keys[i] AND l.expires_at_us + 0 > now_us
				) AS x WHERE s_a[i] - x.freed + cst <= lim ORDER BY x.expires_at_us LIMIT 1;
				retry_after_us := GREATEST(COALESCE(v_free, s_b[i]) - now_us, 1);
			END IF;
		END CASE;
		used := CASE WHEN p_algs[i] IN (2, 3) THEN lim - remaining ELSE s_a[i] END;
		o := o || ARRAY[allowed::int::bigint, remaining, retry_after_us, reset_after_us, s_pl[i], used];
	END LOOP;
	IF p_op = 0 AND p_idem IS NOT NULL AND NOT duplicate AND NOT all_ok THEN
		-- A denied request consumed nothing; forget its idempotency key so a
		-- retry is judged afresh.
		DELETE FROM "{{SCHEMA}}".idempotency AS x WHERE x.prefix = p_idem_prefix AND x.key = p_idem_key AND x.idempotency_key = p_idem;
	ELSIF p_op <> 1 AND p_idem IS NOT NULL AND NOT duplicate THEN
		-- A fresh charge ends the refund record of the same idempotency key
		-- and a fresh refund the charge record (their first bytes differ).
		DELETE FROM "{{SCHEMA}}".idempotency AS x WHERE x.prefix = p_idem_prefix AND x.key = p_idem_key
			AND x.idempotency_key = set_byte(p_idem, 0, CASE WHEN p_op = 0 THEN get_byte(p_idem, 0) - 2 ELSE get_byte(p_idem, 0) + 2 END);
	END IF;
	IF p_cleanup > 0 THEN
		FOR i IN 1..n LOOP
			PERFORM "{{SCHEMA}}".cleanup(p_prefixes[i], now_us - p_ttls[i], p_cleanup);
		END LOOP;
	END IF;
	RETURN o;
END
$fn$;

-- Reset: forget p_key under each of p_prefixes (counter rows, log entries,
-- idempotency records). It first takes the locks a take of the same keys
-- takes, in the same order (prefix in byte order; the advisory lock for a
-- sliding log, p_algs[i] = 4, the counter row otherwise), and deletes only
-- then: every transaction that locks more than one of these rows locks them
-- in that order, so a reset racing takes and refunds of its key cannot
-- deadlock with them. It returns the rows deleted.
DROP FUNCTION IF EXISTS "{{SCHEMA}}".reset(text[], bytea, bigint[], bigint[]);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".reset(p_prefixes text[], p_key bytea, p_algs bigint[], p_locks bigint[])
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
	i bigint;
	a bigint;
	b bigint;
	c bigint;
BEGIN
	IF coalesce(cardinality(p_prefixes), 0) < 1 OR cardinality(p_algs) IS DISTINCT FROM cardinality(p_prefixes)
		OR cardinality(p_locks) IS DISTINCT FROM cardinality(p_prefixes) THEN
		RAISE EXCEPTION 'ratekit: reset arrays must be non-empty and of equal length' USING ERRCODE = '22023';
	END IF;
	FOR i IN SELECT u.o FROM unnest(p_prefixes) WITH ORDINALITY AS u(p, o) ORDER BY u.p COLLATE "C", u.o LOOP
		IF p_algs[i] = 4 THEN
			PERFORM pg_advisory_xact_lock(p_locks[i]);
		ELSE
			-- A missing row is created, as a take creates it, so that a take
			-- that would create it waits for the reset too; it is deleted
			-- below with the rest.
			LOOP
				PERFORM 1 FROM "{{SCHEMA}}".counters AS x WHERE x.prefix = p_prefixes[i] AND x.key = p_key FOR UPDATE;
				EXIT WHEN FOUND;
				INSERT INTO "{{SCHEMA}}".counters (prefix, key, expires_at_us) VALUES (p_prefixes[i], p_key, 0)
				ON CONFLICT (prefix, key) DO NOTHING;
				EXIT WHEN FOUND;
			END LOOP;
		END IF;
	END LOOP;
	DELETE FROM "{{SCHEMA}}".counters AS x WHERE x.prefix = ANY (p_prefixes) AND x.key = p_key;
	GET DIAGNOSTICS a = ROW_COUNT;
	DELETE FROM "{{SCHEMA}}".log AS x WHERE x.prefix = ANY (p_prefixes) AND x.key = p_key;
	GET DIAGNOSTICS b = ROW_COUNT;
	DELETE FROM "{{SCHEMA}}".idempotency AS x WHERE x.prefix = ANY (p_prefixes) AND x.key = p_key;
	GET DIAGNOSTICS c = ROW_COUNT;
	RETURN a + b + c;
END
$fn$;

-- Batch: the decisions of several callers in one statement, one round trip
-- and one commit. Element i of the arrays is one call of a decision function
-- above: p_fn[i] names it (see BatchCases in schema.go) and the other
-- arrays hold its arguments. The calls run in array order, which the caller
-- sorts into the lock order; each sees every earlier one, as it would
-- alone. A statement that calls this one function costs the server little
-- to plan; one that called the decision functions itself would cost much
-- more, at every round trip, since exec mode and a transaction-mode pooler
-- leave every statement unprepared. Returns the calls' results as a
-- two-dimensional array, one row per element, in array order.
DROP FUNCTION IF EXISTS "{{SCHEMA}}".batch(int[], bigint[], text[], bytea[], bigint[], bigint[], bigint[], bigint[], bytea[], bigint[], bigint[], boolean[]);
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".batch(
	p_fn int[], p_op bigint[], p_prefix text[], p_key bytea[], p_cost bigint[], p_quota bigint[],
	p_window_us bigint[], p_lock bigint[], p_idem bytea[], p_idem_ttl_us bigint[], p_cleanup bigint[], p_sync boolean[])
RETURNS bigint[] LANGUAGE plpgsql AS $fn$
DECLARE
	n int := cardinality(p_fn);
	r bigint[];
	res bigint[] := '{}';
BEGIN
	IF n IS NULL OR n < 1 OR cardinality(p_op) <> n OR cardinality(p_prefix) <> n OR cardinality(p_key) <> n
		OR cardinality(p_cost) <> n OR cardinality(p_quota) <> n OR cardinality(p_window_us) <> n
		OR cardinality(p_lock) <> n OR cardinality(p_idem) <> n OR cardinality(p_idem_ttl_us) <> n
		OR cardinality(p_cleanup) <> n OR cardinality(p_sync) <> n THEN
		RAISE EXCEPTION 'ratekit: batch arrays must be non-empty and of equal length' USING ERRCODE = '22023';
	END IF;
	FOR i IN 1..n LOOP
		CASE p_fn[i]
		WHEN 0 THEN
			r := "{{SCHEMA}}".fixed_window_unlogged(p_op[i], p_prefix[i], p_key[i], p_cost[i], p_quota[i], p_window_us[i],
				p_lock[i], p_idem[i], p_idem_ttl_us[i], p_cleanup[i], p_sync[i]);
		WHEN 1 THEN
			r := "{{SCHEMA}}".sliding_window_unlogged(p_op[i], p_prefix[i], p_key[i], p_cost[i], p_quota[i], p_window_us[i],
				p_lock[i], p_idem[i], p_idem_ttl_us[i], p_cleanup[i], p_sync[i]);
		WHEN 2 THEN
			r := "{{SCHEMA}}".token_bucket_unlogged(p_op[i], p_prefix[i], p_key[i], p_cost[i], p_quota[i], p_window_us[i],
				p_lock[i], p_idem[i], p_idem_ttl_us[i], p_cleanup[i], p_sync[i]);
		WHEN 3 THEN
			r := "{{SCHEMA}}".sliding_log_unlogged(p_op[i], p_prefix[i], p_key[i], p_cost[i], p_quota[i], p_window_us[i],
				p_lock[i], p_idem[i], p_idem_ttl_us[i], p_cleanup[i], p_sync[i]);
		WHEN 4 THEN
			r := "{{SCHEMA}}".fixed_window(p_op[i], p_prefix[i], p_key[i], p_cost[i], p_quota[i], p_window_us[i],
				p_lock[i], p_idem[i], p_idem_ttl_us[i], p_cleanup[i], p_sync[i]);
		WHEN 5 THEN
			r := "{{SCHEMA}}".sliding_window(p_op[i], p_prefix[i], p_key[i], p_cost[i], p_quota[i], p_window_us[i],
				p_lock[i], p_idem[i], p_idem_ttl_us[i], p_cleanup[i], p_sync[i]);
		WHEN 6 THEN
			r := "{{SCHEMA}}".token_bucket(p_op[i], p_prefix[i], p_key[i], p_cost[i], p_quota[i], p_window_us[i],
				p_lock[i], p_idem[i], p_idem_ttl_us[i], p_cleanup[i], p_sync[i]);
		WHEN 7 THEN
			r := "{{SCHEMA}}".sliding_log(p_op[i], p_prefix[i], p_key[i], p_cost[i], p_quota[i], p_window_us[i],
				p_lock[i], p_idem[i], p_idem_ttl_us[i], p_cleanup[i], p_sync[i]);
		END CASE;
		res := res || ARRAY[r];
	END LOOP;
	RETURN res;
END
$fn$;

-- Version marker, created last: automatic migration skips all of the above
-- when it exists.
CREATE OR REPLACE FUNCTION "{{SCHEMA}}".ratekit_schema_v15() RETURNS integer
LANGUAGE sql IMMUTABLE AS 'SELECT 15';






