package pgengine

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ratekit/ratekit"
)

// PeriodUsage is what one key used in one period of a policy with a
// Period.
type PeriodUsage struct {
	Key        string
	Start, End time.Time
	Used       int64
}

// periodUsagePage is the most rows one statement of PeriodUsage reads.
const periodUsagePage = 1000

// PeriodUsageSQL returns the statement PeriodUsage runs (with the schema
// and durability filled in), for documentation and for callers that run it
// themselves. Its parameters: $1 the counter's prefix, $2 and $3 the range
// of period starts [from, to) in microseconds since the epoch, $4 true for
// the first page, $5 and $6 the last key and period start of the previous
// page, $7 the page size. It returns one row of four arrays: keys, period
// starts, period ends and units used, ordered by key and period start.
func (s *Store) PeriodUsageSQL(d Durability) string {
	counters := s.quoted + "." + d.table("counters")
	usage := s.quoted + "." + d.table("period_usage")
	return `SELECT COALESCE(array_agg(x.key ORDER BY x.key, x.s), '{}'), COALESCE(array_agg(x.s ORDER BY x.key, x.s), '{}'),
	COALESCE(array_agg(x.e ORDER BY x.key, x.s), '{}'), COALESCE(array_agg(x.used ORDER BY x.key, x.s), '{}')
FROM (
	SELECT y.key, y.s, max(y.e) AS e, sum(y.used)::bigint AS used FROM (
		SELECT c.key, c.window_start_us AS s, c.expires_at_us AS e, c.count AS used FROM ` + counters + ` AS c
		WHERE c.prefix = $1 AND c.window_start_us >= $2 AND c.window_start_us < $3 AND c.count > 0
		UNION ALL
		SELECT u.key, u.period_start_us, u.period_end_us, u.used FROM ` + usage + ` AS u
		WHERE u.prefix = $1 AND u.period_start_us >= $2 AND u.period_start_us < $3
	) AS y
	WHERE $4 OR (y.key, y.s) > ($5::bytea, $6::bigint)
	GROUP BY y.key, y.s ORDER BY y.key, y.s LIMIT $7
) AS x`
}

// PeriodUsage calls fn, in order of key and period start, with the units
// each key used in each period of the counter with a Period whose start is
// in [from, to), skipping periods with nothing used (see
// [Store.PeriodUsage]).
func (c *Counter) PeriodUsage(ctx context.Context, from, to time.Time, fn func(PeriodUsage) error) error {
	if c.single == nil {
		return fmt.Errorf("%w: policy %q has no period", ratekit.ErrInvalidConfig, c.cfg.Prefix)
	}
	return c.store.PeriodUsage(ctx, c.cfg.Durability, c.cfg.Prefix, from, to, fn)
}

// PeriodUsage calls fn, in order of key and period start, with the units
// each key used in each period, under prefix (a counter with a Period),
// whose start is in [from, to), skipping periods with nothing used. Each
// statement ([Store.PeriodUsageSQL]) reads up to 1,000 rows in one
// snapshot; a period's usage is in exactly one of the counter row and the
// usage table at any time, so the figures of periods that have ended are
// exact. Periods in progress are read as they stand. An error of fn stops
// the reading and is returned as is; other errors wrap the pgx error.
func (s *Store) PeriodUsage(ctx context.Context, d Durability, prefix string, from, to time.Time, fn func(PeriodUsage) error) error {
	if err := ratekit.ValidatePolicyName(prefix); err != nil {
		return fmt.Errorf("%w (prefix)", err)
	}
	if err := s.ensureSchema(ctx); err != nil {
		return err
	}
	shift := s.shift.Microseconds()
	lo, hi := from.UnixMicro()+shift, to.UnixMicro()+shift
	q := s.PeriodUsageSQL(d)
	first, lastKey, lastStart := true, []byte{}, int64(0)
	for {
		var (
			keys         [][]byte
			starts, ends []int64
			used         []int64
		)
		err := s.exec(func(mode pgx.QueryExecMode) error {
			return s.db.QueryRow(ctx, q, mode, prefix, lo, hi, first, lastKey, lastStart, periodUsagePage).
				Scan(&keys, &starts, &ends, &used)
		})
		if err != nil {
			return wrapErr(ctx, "period usage", err)
		}
		for i := range keys {
			u := PeriodUsage{
				Key:   string(keys[i]),
				Start: time.UnixMicro(starts[i] - shift),
				End:   time.UnixMicro(ends[i] - shift),
				Used:  used[i],
			}
			if err := fn(u); err != nil {
				return err
			}
		}
		if len(keys) < periodUsagePage {
			return nil
		}
		first, lastKey, lastStart = false, keys[len(keys)-1], starts[len(starts)-1]
	}
}
