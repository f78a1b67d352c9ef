package dynamostore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/big"
	"math/bits"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
)

// DefaultMaxAttempts is the number of conditional writes one [Store.Update]
// makes at most when [Config.MaxAttempts] is zero.
const DefaultMaxAttempts = 4

// MaxKeyLen is the longest key DynamoDB accepts as a partition key, in
// bytes: [Config.Prefix] and the key together must not be longer.
const MaxKeyLen = 2048

// The item's attributes. KeyAttribute and TTLAttribute are part of the
// table's definition (see [CreateTable]); the others are written by the
// Store.
const (
	// KeyAttribute is the table's partition key, of type Binary (B): the
	// prefix and the key's bytes, so that any key, valid UTF-8 or not,
	// is its own item.
	KeyAttribute = "pk"

	// TTLAttribute is the attribute the table's Time to Live must use: the
	// item's expiry in seconds since the Unix epoch, rounded up, plus
	// TTLMargin.
	TTLAttribute = "ttl"

	// TTLMargin is added to the expiry written in TTLAttribute, so that
	// DynamoDB, which deletes by its own clock, never removes an item
	// before an instance whose clock runs behind considers it expired.
	TTLMargin = time.Minute
)

// ErrContention is returned (wrapped) by [Store.Update] when
// [Config.MaxAttempts] conditional writes in a row failed because other
// instances changed the item in between. Nothing was written by the call.
var ErrContention = errors.New("dynamostore: conditional writes kept failing under contention")

// ErrNoTTL is returned (wrapped) by [CreateTable] when the server created the
// table but does not implement UpdateTimeToLive (dynalite, DynamoDB Local
// before 2023). The Store checks expiry on every read, so such a table works;
// it only keeps expired items until they are deleted or overwritten.
var ErrNoTTL = errors.New("dynamostore: the server does not support Time to Live")

// Config configures a [Store]. Table is required; the zero value of every
// other field is valid.
type Config struct {
	// Table is the name of the DynamoDB table: partition key KeyAttribute
	// of type Binary, no sort key, Time to Live on TTLAttribute.
	Table string

	// Prefix is prepended to every key, so that several users can share a
	// table. Empty means no prefix. At most 1024 bytes.
	Prefix string

	// Now is the clock of every decision and expiry: DynamoDB has none.
	// Nil means time.Now. See docs/dynamodb.md in the repository for what
	// skew between the clocks of instances does.
	Now func() time.Time

	// EventuallyConsistentReads makes Get read with eventual consistency:
	// half a read request unit instead of one, at the price of reads that
	// may miss writes of the last second or so, which widens the race
	// window of tokenbucket's Eventual mode. Update always reads with
	// strong consistency.
	EventuallyConsistentReads bool

	// HistoryTTL is how long the count of a period counter's ended period
	// is kept ([Store.PeriodUsage]), from the period's end. Zero means
	// DefaultHistoryTTL; otherwise at least a day.
	HistoryTTL time.Duration

	// MaxAttempts is the most conditional writes one Update makes; when
	// all fail because other instances changed the item in between, Update
	// returns ErrContention. Zero means DefaultMaxAttempts; otherwise at
	// least 1.
	MaxAttempts int
}

// Store is a [kvstore.Store] and [kvstore.Atomic] on a DynamoDB table. It is
// safe for concurrent use; it holds no connection of its own and never
// closes or reconfigures the client.
type Store struct {
	client     *dynamodb.Client
	table      *string
	prefix     string
	now        func() time.Time
	consistent bool
	attempts   int
	historyTTL time.Duration
	hints      hints
	// capacity, when not nil, receives the consumed capacity of every
	// request (tests set it).
	capacity func(*types.ConsumedCapacity)
}

var (
	_ kvstore.Store         = (*Store)(nil)
	_ kvstore.Atomic        = (*Store)(nil)
	_ kvstore.PeriodCounter = (*Store)(nil)
)

// New returns a Store on the table cfg.Table through client. It sends
// nothing. It returns an error matching ratekit.ErrInvalidConfig for a nil
// client, an empty table name, a prefix longer than 1024 bytes or a negative
// MaxAttempts, or a HistoryTTL below a day or above a hundred years.
func New(client *dynamodb.Client, cfg Config) (*Store, error) {
	switch {
	case client == nil:
		return nil, configErr("nil client")
	case cfg.Table == "":
		return nil, configErr("empty table name")
	case len(cfg.Prefix) > MaxKeyLen/2:
		return nil, configErr("prefix of %d bytes is longer than %d", len(cfg.Prefix), MaxKeyLen/2)
	case cfg.MaxAttempts < 0:
		return nil, configErr("MaxAttempts %d is negative", cfg.MaxAttempts)
	case cfg.HistoryTTL != 0 && (cfg.HistoryTTL < 24*time.Hour || cfg.HistoryTTL > 100*365*24*time.Hour):
		return nil, configErr("HistoryTTL %v is not from a day to a hundred years", cfg.HistoryTTL)
	}
	if cfg.HistoryTTL == 0 {
		cfg.HistoryTTL = DefaultHistoryTTL
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Store{
		client:     client,
		table:      aws.String(cfg.Table),
		prefix:     cfg.Prefix,
		now:        cfg.Now,
		consistent: !cfg.EventuallyConsistentReads,
		attempts:   cfg.MaxAttempts,
		historyTTL: cfg.HistoryTTL,
		hints:      hints{seed: maphash.MakeSeed()},
	}, nil
}

// noRetries is the per-call option of every request: the SDK's retryer
// would resend a write whose response was lost, which may have been applied.
// A failed request is the caller's error to handle (its failure policy).
func noRetries(o *dynamodb.Options) {
	o.Retryer = aws.NopRetryer{}
	o.RetryMaxAttempts = 0
}

// key returns the partition key of key, or an error matching
// ratekit.ErrEmptyKey or ratekit.ErrKeyTooLong when DynamoDB would refuse
// it.
func (s *Store) key(key string) (map[string]types.AttributeValue, error) {
	n := len(s.prefix) + len(key)
	if n == 0 {
		return nil, fmt.Errorf("dynamostore: %w", ratekit.ErrEmptyKey)
	}
	if n > MaxKeyLen {
		return nil, fmt.Errorf("dynamostore: %w: %d bytes with the prefix, DynamoDB's limit is %d", ratekit.ErrKeyTooLong, n, MaxKeyLen)
	}
	b := make([]byte, 0, n)
	b = append(append(b, s.prefix...), key...)
	return map[string]types.AttributeValue{KeyAttribute: &types.AttributeValueMemberB{Value: b}}, nil
}

// Prefix returns Config.Prefix.
func (s *Store) Prefix() string { return s.prefix }

// Get implements [kvstore.Store] with one GetItem, strongly consistent
// unless Config.EventuallyConsistentReads is set. An item past its expiry on
// the Store's clock reads as missing, whether or not DynamoDB has deleted it.
// It returns kvstore.ErrMalformedRecord for an item this package did not
// write.
func (s *Store) Get(ctx context.Context, key string) (kvstore.Record, bool, error) {
	k, err := s.key(key)
	if err != nil {
		return kvstore.Record{}, false, err
	}
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      s.table,
		Key:            k,
		ConsistentRead: aws.Bool(s.consistent),
	}, noRetries)
	if err != nil {
		return kvstore.Record{}, false, wrap(ctx, "GetItem", err)
	}
	it, err := parseItem(out.Item)
	if err != nil {
		return kvstore.Record{}, false, err
	}
	if !it.live(s.now().UnixMicro()) {
		return kvstore.Record{}, false, nil
	}
	return it.rec, true, nil
}

// Set implements [kvstore.Store] with one PutItem, which replaces the whole
// item. The expiry is the Store's clock plus ttl (rounded up to one
// millisecond).
func (s *Store) Set(ctx context.Context, key string, rec kvstore.Record, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: got %v", kvstore.ErrInvalidTTL, ttl)
	}
	k, err := s.key(key)
	if err != nil {
		return err
	}
	ttl = max(ttl, time.Millisecond)
	exp := s.now().UnixMicro() + int64((ttl+time.Microsecond-1)/time.Microsecond)
	item := record(k, rec.Value, rec.Time, exp)
	_, err = s.client.PutItem(ctx, &dynamodb.PutItemInput{TableName: s.table, Item: item}, noRetries)
	if err != nil {
		return wrap(ctx, "PutItem", err)
	}
	return nil
}

// Delete implements [kvstore.Store] with one DeleteItem.
func (s *Store) Delete(ctx context.Context, key string) error {
	k, err := s.key(key)
	if err != nil {
		return err
	}
	if _, err := s.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: s.table, Key: k}, noRetries); err != nil {
		return wrap(ctx, "DeleteItem", err)
	}
	return nil
}

// Update implements [kvstore.Atomic] with conditional writes on the Store's
// clock (Config.Now): DynamoDB has none. OpTake is one conditional
// UpdateItem in the common case; OpPeek one strongly consistent GetItem;
// OpRefund a GetItem and a conditional write. See docs/dynamodb.md in the
// repository for the requests, what they cost, and the one way the result
// differs from [kvstore.Refill.Apply] (an item read before its own time,
// when clocks disagree). A refused take writes nothing.
//
// A condition that fails is never an error: Update decides with the item it
// failed on and retries, up to Config.MaxAttempts conditional writes in all,
// then returns ErrContention with nothing written. Any other failure
// (throttling, a missing table, refused credentials, a timeout) is returned
// at once, wrapped, and nothing that may have been applied is sent again. It
// returns kvstore.ErrInvalidRefill and kvstore.ErrInvalidOp before sending
// anything, and kvstore.ErrMalformedRecord for an item this package did not
// write.
func (s *Store) Update(ctx context.Context, key string, r kvstore.Refill, op kvstore.Op, n int64) (kvstore.OpResult, error) {
	if err := r.Validate(); err != nil {
		return kvstore.OpResult{}, err
	}
	if err := r.CheckOp(op, n); err != nil {
		return kvstore.OpResult{}, err
	}
	k, err := s.key(key)
	if err != nil {
		return kvstore.OpResult{}, err
	}
	// writes counts the conditional writes sent, against Config.MaxAttempts.
	writes := 0
	var old map[string]types.AttributeValue
	if op == kvstore.OpTake {
		writes++
		res, failed, err := s.firstTake(ctx, k, r, n)
		if err != nil || failed == nil {
			return res, err
		}
		old = failed.Item
	} else if old, err = s.read(ctx, k); err != nil {
		// A refund or a peek starts from the item as it is.
		return kvstore.OpResult{}, err
	}
	for {
		res, failed, err := s.attempt(ctx, k, r, op, n, old, &writes)
		if err != nil || failed == nil {
			return res, err
		}
		if err := ctx.Err(); err != nil {
			return kvstore.OpResult{}, fmt.Errorf("dynamostore: %w", err)
		}
		old = failed.Item
	}
}

// firstTake sends the first take of n units on k: the form that the last
// decision on this key in this Store predicts (a bucket that is not full
// yet), or else the full form, right for a key that is new or idle since
// it refilled. It returns what take returns.
func (s *Store) firstTake(ctx context.Context, k map[string]types.AttributeValue, r kvstore.Refill, n int64) (kvstore.OpResult, *types.ConditionalCheckFailedException, error) {
	now := s.now().UnixMicro()
	full, seen := s.hints.get(k, now)
	res, failed, err := s.take(ctx, k, r, n, now, full || !seen)
	if err == nil && failed == nil {
		s.hints.set(k, now+int64(r.TimeToFull(res.Remaining)/time.Microsecond))
	}
	return res, failed, err
}

// attempt decides op on k with the item old (read first when nil: the
// failure did not carry it) and, when the decision writes, sends the
// conditional write, counting it in *writes. It returns the result when
// the decision is made, the failure when the write's condition failed, or
// the error (ErrContention once Config.MaxAttempts writes were sent).
func (s *Store) attempt(ctx context.Context, k map[string]types.AttributeValue, r kvstore.Refill, op kvstore.Op, n int64, old map[string]types.AttributeValue, writes *int) (kvstore.OpResult, *types.ConditionalCheckFailedException, error) {
	if old == nil {
		// The failure did not carry the item (dynalite does not
		// implement ReturnValuesOnConditionCheckFailure; AWS omits an
		// item that no longer exists): read it.
		var err error
		if old, err = s.read(ctx, k); err != nil {
			return kvstore.OpResult{}, nil, err
		}
	}
	it, err := parseItem(old)
	if err != nil {
		return kvstore.OpResult{}, nil, err
	}
	now := s.now().UnixMicro()
	if it.present && it.rate == r.Rate {
		s.hints.set(k, it.fullAt(r))
	}
	live := it.live(now)
	res, next, write, err := r.Apply(it.view(r, now), live, now, op, n)
	if err != nil || !write {
		// A refused take or a peek: nothing to write.
		return res, nil, err
	}
	if next.Value >= r.Burst && !live {
		// Full and absent (or expired) already.
		return res, nil, nil
	}
	if *writes == s.attempts {
		return kvstore.OpResult{}, nil, fmt.Errorf("%w: %d conditional writes on one key", ErrContention, *writes)
	}
	*writes++
	return s.write(ctx, k, r, op, n, it, now, res, next)
}

// write sends the conditional write of a decision on item it at now whose
// result is res and next record next: a take, a delete of a bucket that
// is full again, or the next record. It returns what attempt returns.
func (s *Store) write(ctx context.Context, k map[string]types.AttributeValue, r kvstore.Refill, op kvstore.Op, n int64, it item, now int64, res kvstore.OpResult, next kvstore.Record) (kvstore.OpResult, *types.ConditionalCheckFailedException, error) {
	var (
		failed *types.ConditionalCheckFailedException
		err    error
	)
	switch {
	case op == kvstore.OpTake && (!it.present || it.rate == r.Rate):
		// A range condition accepts the item as it is now, and a
		// concurrent take does not make it fail again.
		res, failed, err = s.take(ctx, k, r, n, now, !it.partial(r, now))
	case next.Value >= r.Burst:
		failed, err = s.deleteIf(ctx, k, it)
	default:
		failed, err = s.writeIf(ctx, k, it, r, next)
	}
	if err == nil && failed == nil && op == kvstore.OpTake {
		s.hints.set(k, now+int64(r.TimeToFull(res.Remaining)/time.Microsecond))
	}
	return res, failed, err
}

// take sends a conditional UpdateItem that takes n units from the bucket
// when the item is absent or written by Update with r's rate and, for the
// partial form, its bucket holds n units or more without being full at now,
// or, for the full form, its bucket is full at now.
//
// The item keeps, besides the level v at time t, x = t×Rate − v: the level
// at a time T is T×Rate − x, capped at Burst (see item.view), so the
// conditions and updates need no arithmetic DynamoDB lacks. With
// f = now×Rate − Burst and c = now×Rate − n, the bucket holds n units or more
// without being full when f ≤ x ≤ c, and a take sets x to x + n and v to
// c − x; it is full when x ≤ f, and a take sets x to f + n and v to Burst − n.
// An absent item is full. Neither condition names a time or an exact value,
// so takes racing on one key do not make each other's conditions fail. The
// numbers reach 2^104 (a time in microseconds times a rate up to 2^53);
// DynamoDB's numbers hold 38 digits.
//
// It returns the result when the write was applied, the failure when the
// condition failed, or the error.
func (s *Store) take(ctx context.Context, k map[string]types.AttributeValue, r kvstore.Refill, n, now int64, full bool) (kvstore.OpResult, *types.ConditionalCheckFailedException, error) {
	nowR := new(big.Int).Mul(big.NewInt(now), big.NewInt(r.Rate))
	f := new(big.Int).Sub(nowR, big.NewInt(r.Burst))
	exp := now + int64(r.TimeToFull(0)/time.Microsecond)
	values := map[string]types.AttributeValue{
		":f":   &types.AttributeValueMemberN{Value: f.String()},
		":now": num(now),
		":r":   num(r.Rate),
		":e":   num(exp),
		":ttl": num(ttlSeconds(exp)),
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                           s.table,
		Key:                                 k,
		ExpressionAttributeNames:            map[string]string{"#ttl": TTLAttribute},
		ExpressionAttributeValues:           values,
		ReturnValues:                        types.ReturnValueUpdatedNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		ReturnConsumedCapacity:              s.capacityMode(),
	}
	if full {
		values[":x"] = &types.AttributeValueMemberN{Value: f.Add(f, big.NewInt(n)).String()}
		values[":v"] = num(r.Burst - n)
		in.UpdateExpression = aws.String("SET x = :x, v = :v, t = :now, r = :r, e = :e, #ttl = :ttl")
		in.ConditionExpression = aws.String("attribute_not_exists(" + KeyAttribute + ") OR (r = :r AND x <= :f)")
	} else {
		values[":n"] = num(n)
		values[":c"] = &types.AttributeValueMemberN{Value: nowR.Sub(nowR, big.NewInt(n)).String()}
		in.UpdateExpression = aws.String("SET x = if_not_exists(x, :f) + :n, v = :c - if_not_exists(x, :f), t = :now, r = :r, e = :e, #ttl = :ttl")
		in.ConditionExpression = aws.String("attribute_not_exists(" + KeyAttribute + ") OR (r = :r AND x BETWEEN :f AND :c)")
	}
	out, err := s.client.UpdateItem(ctx, in, noRetries)
	if out != nil {
		s.observe(out.ConsumedCapacity)
	}
	if err != nil {
		var failed *types.ConditionalCheckFailedException
		if errors.As(err, &failed) {
			return kvstore.OpResult{}, failed, nil
		}
		return kvstore.OpResult{}, nil, wrap(ctx, "UpdateItem", err)
	}
	v, err := intAttr(out.Attributes, "v")
	if err != nil {
		return kvstore.OpResult{}, nil, err
	}
	return kvstore.OpResult{OK: true, Remaining: v}, nil, nil
}

// writeIf writes next (the result of Apply on it) with an UpdateItem
// conditioned on the item being it, unchanged. (An UpdateItem rather than a
// PutItem, so that a take needs no IAM action beyond UpdateItem and GetItem.)
func (s *Store) writeIf(ctx context.Context, k map[string]types.AttributeValue, it item, r kvstore.Refill, next kvstore.Record) (*types.ConditionalCheckFailedException, error) {
	// As for take: the item lives until a bucket emptied at its time
	// would be full.
	exp := next.Time + int64(r.TimeToFull(0)/time.Microsecond)
	x := new(big.Int).Mul(big.NewInt(next.Time), big.NewInt(r.Rate))
	x.Sub(x, big.NewInt(next.Value))
	cond, values := it.unchanged()
	if values == nil {
		values = make(map[string]types.AttributeValue, 6)
	}
	values[":x"] = &types.AttributeValueMemberN{Value: x.String()}
	values[":v"] = num(next.Value)
	values[":t"] = num(next.Time)
	values[":r"] = num(r.Rate)
	values[":e"] = num(exp)
	values[":ttl"] = num(ttlSeconds(exp))
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           s.table,
		Key:                                 k,
		UpdateExpression:                    aws.String("SET x = :x, v = :v, t = :t, r = :r, e = :e, #ttl = :ttl"),
		ConditionExpression:                 cond,
		ExpressionAttributeNames:            map[string]string{"#ttl": TTLAttribute},
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, noRetries)
	return conditional(ctx, "UpdateItem", err)
}

// deleteIf deletes the item when it is it, unchanged.
func (s *Store) deleteIf(ctx context.Context, k map[string]types.AttributeValue, it item) (*types.ConditionalCheckFailedException, error) {
	cond, values := it.unchanged()
	_, err := s.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                           s.table,
		Key:                                 k,
		ConditionExpression:                 cond,
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, noRetries)
	return conditional(ctx, "DeleteItem", err)
}

// read returns the item under k with a strongly consistent GetItem (nil
// when there is none).
func (s *Store) read(ctx context.Context, k map[string]types.AttributeValue) (map[string]types.AttributeValue, error) {
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: s.table, Key: k, ConsistentRead: aws.Bool(true)}, noRetries)
	if err != nil {
		return nil, wrap(ctx, "GetItem", err)
	}
	if out.Item == nil {
		return map[string]types.AttributeValue{}, nil
	}
	return out.Item, nil
}

// conditional sorts the error of a conditional write: nil, a failed
// condition, or an error.
func conditional(ctx context.Context, op string, err error) (*types.ConditionalCheckFailedException, error) {
	if err == nil {
		return nil, nil
	}
	var failed *types.ConditionalCheckFailedException
	if errors.As(err, &failed) {
		return failed, nil
	}
	return nil, wrap(ctx, op, err)
}

// item is an item as this package reads it.
type item struct {
	present bool
	rec     kvstore.Record
	exp     int64 // microseconds since the Unix epoch
	rate    int64 // the rate x was computed with; 0 without x
	// v, t and e as stored, for a condition that the item is unchanged.
	v, t, e types.AttributeValue
}

// live reports whether the item holds a record at now: present and not
// expired.
func (it item) live(now int64) bool { return it.present && it.exp > now }

// partial reports whether the bucket of an item written by Update with r's
// rate is not full at now (see item.view).
func (it item) partial(r kvstore.Refill, now int64) bool {
	if !it.present || it.rate != r.Rate || it.rec.Value >= r.Burst {
		return false
	}
	if it.rec.Time >= now {
		return true
	}
	// v + (now-t)×Rate < Burst, in 128 bits.
	hi, lo := bits.Mul64(uint64(now-it.rec.Time), uint64(r.Rate))
	return hi == 0 && lo < uint64(r.Burst-it.rec.Value)
}

// fullAt returns when the bucket of an item written by Update with r's rate
// is full, in microseconds since the Unix epoch.
func (it item) fullAt(r kvstore.Refill) int64 {
	return it.rec.Time + int64(r.TimeToFull(it.rec.Value)/time.Microsecond)
}

// view returns the record an item written by Update with r's rate stands
// for at now. Such an item is a line, the level at time T being
// T×Rate − x (capped at Burst), as in GCRA; its v and t are the point of the
// line at the time of the write. Read at a now before t (the writer's clock
// was ahead, or a request of this instance that read the clock later
// arrived first), the line gives v − (t−now)×Rate at now: fewer units than
// v, never more. That keeps take's condition free of time, so that writers
// whose clocks disagree do not make each other's conditions fail. Any other
// record is returned as it is, for kvstore.Refill.Apply.
func (it item) view(r kvstore.Refill, now int64) kvstore.Record {
	if it.rate != r.Rate || it.rec.Time <= now {
		return it.rec
	}
	hi, lo := bits.Mul64(uint64(it.rec.Time-now), uint64(r.Rate))
	if hi != 0 || lo > uint64(max(it.rec.Value, 0)) {
		// Below zero: Apply reads it as 0, and a take is refused.
		return kvstore.Record{Value: -1, Time: now}
	}
	return kvstore.Record{Value: it.rec.Value - int64(lo), Time: now}
}

// unchanged returns the condition that the item is still it: absent, or
// with the same value, time and expiry. Those three are the whole state a
// decision reads, so an item that has them again after other writes (ABA)
// is the same bucket, and the decision computed from it still holds.
func (it item) unchanged() (*string, map[string]types.AttributeValue) {
	if !it.present {
		return aws.String("attribute_not_exists(" + KeyAttribute + ")"), nil
	}
	return aws.String("v = :ov AND t = :ot AND e = :oe"), map[string]types.AttributeValue{":ov": it.v, ":ot": it.t, ":oe": it.e}
}

// parseItem reads an item (nil or empty: absent). It returns
// kvstore.ErrMalformedRecord when v, t or e is missing or not an integer.
func parseItem(m map[string]types.AttributeValue) (item, error) {
	if len(m) == 0 {
		return item{}, nil
	}
	if _, ok := m[attrGroup]; ok {
		return item{}, fmt.Errorf("%w: a group item, not a key's", kvstore.ErrMalformedRecord)
	}
	it := item{present: true, v: m["v"], t: m["t"], e: m["e"]}
	var err error
	if it.rec.Value, err = intAttr(m, "v"); err != nil {
		return item{}, err
	}
	if it.rec.Time, err = intAttr(m, "t"); err != nil {
		return item{}, err
	}
	if it.exp, err = intAttr(m, "e"); err != nil {
		return item{}, err
	}
	if _, ok := m["x"]; ok {
		if it.rate, err = intAttr(m, "r"); err != nil {
			return item{}, err
		}
	}
	return it, nil
}

// intAttr returns the number attribute name of m as an int64, or an error
// matching kvstore.ErrMalformedRecord.
func intAttr(m map[string]types.AttributeValue, name string) (int64, error) {
	a, ok := m[name].(*types.AttributeValueMemberN)
	if !ok {
		return 0, fmt.Errorf("%w: attribute %q is missing or not a number", kvstore.ErrMalformedRecord, name)
	}
	v, err := strconv.ParseInt(a.Value, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: attribute %q: %v", kvstore.ErrMalformedRecord, name, err)
	}
	return v, nil
}

// record returns the item of a record: key, value, time, expiry and the
// Time to Live attribute.
func record(k map[string]types.AttributeValue, v, t, exp int64) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		KeyAttribute: k[KeyAttribute],
		"v":          num(v),
		"t":          num(t),
		"e":          num(exp),
		TTLAttribute: num(ttlSeconds(exp)),
	}
}

func num(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// ttlSeconds returns the Time to Live attribute for an expiry in
// microseconds: seconds since the Unix epoch, rounded up, plus TTLMargin.
func ttlSeconds(exp int64) int64 {
	s := exp / 1e6
	if exp%1e6 > 0 {
		s++
	}
	return s + int64(TTLMargin/time.Second)
}

// wrap names the failed request and makes sure an error caused by ctx
// matches ctx.Err() with errors.Is: a deadline that has passed counts as
// context.DeadlineExceeded even when the HTTP client noticed it first.
func wrap(ctx context.Context, op string, err error) error {
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(dl) {
		cerr = context.DeadlineExceeded
	}
	if cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("dynamostore: %s: %w: %w", op, cerr, err)
	}
	return fmt.Errorf("dynamostore: %s: %w", op, err)
}

// hintSlots is the number of keys whose next form of take a Store predicts.
const hintSlots = 1024

// hints remembers, for the keys this Store decided on last, when their
// bucket is full, to pick the form of take (see Store.take) that the next
// decision most likely needs. A wrong or missing hint costs one more
// conditional write, never a wrong decision. Keys share slots by hash: the
// last one wins.
type hints struct {
	seed  maphash.Seed
	slots [hintSlots]atomic.Pointer[hint]
}

type hint struct {
	key    []byte
	fullAt int64 // microseconds since the Unix epoch
}

func (h *hints) slot(k map[string]types.AttributeValue) (*atomic.Pointer[hint], []byte) {
	b := k[KeyAttribute].(*types.AttributeValueMemberB).Value
	return &h.slots[maphash.Bytes(h.seed, b)%hintSlots], b
}

// get reports whether the bucket of k is full at now, and whether the
// Store knows.
func (h *hints) get(k map[string]types.AttributeValue, now int64) (full, ok bool) {
	p, b := h.slot(k)
	if e := p.Load(); e != nil && bytes.Equal(e.key, b) {
		return now >= e.fullAt, true
	}
	return false, false
}

func (h *hints) set(k map[string]types.AttributeValue, fullAt int64) {
	p, b := h.slot(k)
	p.Store(&hint{key: b, fullAt: fullAt})
}

// getValue returns the value remembered for the record key b (a bucket's
// full time, a counter's period start), and whether there is one.
func (h *hints) getValue(b []byte) (int64, bool) {
	if e := h.slots[maphash.Bytes(h.seed, b)%hintSlots].Load(); e != nil && bytes.Equal(e.key, b) {
		return e.fullAt, true
	}
	return 0, false
}

// getKey reports whether the bucket of record key b is full at now, and
// whether the Store knows.
func (h *hints) getKey(b []byte, now int64) (full, ok bool) {
	v, ok := h.getValue(b)
	return ok && now >= v, ok
}

func (h *hints) setValue(b []byte, v int64) {
	h.slots[maphash.Bytes(h.seed, b)%hintSlots].Store(&hint{key: b, fullAt: v})
}

func (h *hints) setKey(b []byte, fullAt int64) { h.setValue(b, fullAt) }

// capacityMode returns what the requests ask of ConsumedCapacity: TOTAL
// when the Store reports it (tests), else nothing.
func (s *Store) capacityMode() types.ReturnConsumedCapacity {
	if s.capacity != nil {
		return types.ReturnConsumedCapacityTotal
	}
	return ""
}

func (s *Store) observe(c *types.ConsumedCapacity) {
	if s.capacity != nil && c != nil {
		s.capacity(c)
	}
}

// configErr returns an error matching ratekit.ErrInvalidConfig that reads
// "dynamostore: invalid config: " and format's text: every configuration
// error of this package is made here.
func configErr(format string, args ...any) error {
	return fmt.Errorf("dynamostore: %w: %s", ratekit.ErrInvalidConfig, fmt.Sprintf(format, args...))
}
