package pgengine

import "github.com/ratekit/ratekit"

// The codes that the schema's functions take, written out once here and
// never derived from the order of an enum: the Go code sends these
// constants, and schema.sql names them through the template functions op,
// alg and tag (see sqlCodes), so the SQL holds no bare code. Changing a
// code changes what an installed schema does with it: bump SchemaVersion
// with it.
const (
	// p_op: what a decision does.
	opTake   int64 = 0
	opPeek   int64 = 1
	opRefund int64 = 2

	// p_algs, and the batch function's p_fn: how a policy counts.
	algFixedWindow   int64 = 1
	algSlidingWindow int64 = 2
	algTokenBucket   int64 = 3
	algSlidingLog    int64 = 4
	// algPeriod is a fixed window over calendar periods, decided only by
	// the composite function.
	algPeriod int64 = 5

	// fnComposite is the last digit of the batch function's p_fn that
	// names a composite function (the other digits name a single-key
	// function's algorithm); the digits before it are the durability.
	fnComposite int32 = 0

	// The first byte of an idempotency record, which keeps the records of
	// takes and refunds, of single-key decisions and of composites apart.
	tagTake            byte = 't'
	tagRefund          byte = 'r'
	tagCompositeTake   byte = 'T'
	tagCompositeRefund byte = 'R'
)

// sqlCodes is the table schema.sql reads its codes from: {{op "take"}},
// {{alg "sliding_log"}}, {{tag "composite_take"}}. A name missing here fails
// the template, so SchemaSQL, and every test, fails.
var sqlCodes = map[string]map[string]int64{
	"op": {"take": opTake, "peek": opPeek, "refund": opRefund},
	"alg": {
		"fixed_window":   algFixedWindow,
		"sliding_window": algSlidingWindow,
		"token_bucket":   algTokenBucket,
		"sliding_log":    algSlidingLog,
		"period":         algPeriod,
	},
	"tag": {
		"take":             int64(tagTake),
		"refund":           int64(tagRefund),
		"composite_take":   int64(tagCompositeTake),
		"composite_refund": int64(tagCompositeRefund),
	},
}

// singleAlgorithms are the algorithms that have a single-key decision
// function, by their name in sqlCodes["alg"]; compositeAlgorithms are the
// arms of the composite function.
var (
	singleAlgorithms    = []string{"fixed_window", "sliding_window", "token_bucket", "sliding_log"}
	compositeAlgorithms = []string{"fixed_window", "period", "sliding_window", "token_bucket", "sliding_log"}
)

// algName returns a's name in sqlCodes["alg"], "" for an unknown algorithm.
func algName(a ratekit.Algorithm) string {
	switch a {
	case ratekit.FixedWindow:
		return "fixed_window"
	case ratekit.SlidingWindow:
		return "sliding_window"
	case ratekit.TokenBucket:
		return "token_bucket"
	case ratekit.SlidingLog:
		return "sliding_log"
	}
	return ""
}

// algCode returns the code of a that the schema's functions take.
func algCode(a ratekit.Algorithm) int64 { return sqlCodes["alg"][algName(a)] }
