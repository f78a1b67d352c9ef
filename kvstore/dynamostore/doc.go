// Package dynamostore is a [kvstore.Store] and [kvstore.Atomic] on Amazon
// DynamoDB, through aws-sdk-go-v2's [dynamodb.Client]: a token bucket on the
// store that AWS Lambda functions already have, with no server to run, size
// or keep warm, billed per request. It is a module of its own, so the AWS SDK
// enters the module graph only of programs that import it.
//
// # Table
//
// One table, on-demand billing, partition key [KeyAttribute] ("pk") of type
// Binary and no sort key, Time to Live on [TTLAttribute] ("ttl"):
//
//	aws dynamodb create-table --table-name ratekit --billing-mode PAY_PER_REQUEST \
//	    --attribute-definitions AttributeName=pk,AttributeType=B \
//	    --key-schema AttributeName=pk,KeyType=HASH
//	aws dynamodb update-time-to-live --table-name ratekit \
//	    --time-to-live-specification Enabled=true,AttributeName=ttl
//
// [CreateTable] does the same for tests and local use. Every key is one item:
// [Config.Prefix] and the key's bytes, as a Binary partition key, so that any
// key is its own item (a String key would have to be valid UTF-8), at most
// [MaxKeyLen] bytes. One decision reads or writes that one item, nothing
// else. An item holds the level v at time t (microseconds since the Unix
// epoch), its expiry e, the TTL attribute, and for items written by Update,
// x = t×Rate − v and the rate r (below).
//
// Expiry is checked on every read against the Store's clock: DynamoDB's Time
// to Live deletes expired items lazily, within days, and only frees storage.
// The TTL attribute is the expiry in seconds, rounded up, plus [TTLMargin]
// (a minute), so that DynamoDB, which deletes by its own clock, never removes
// an item that an instance whose clock runs behind still counts.
//
// # Atomic mode: conditional writes
//
// Update keeps a token bucket as GCRA does: a line. The level at a time T is
// T×Rate − x, capped at the bucket's Max, where x is the one number the item
// changes; v and t are the point of the line at the last write. So a take of
// n units at time now is one UpdateItem whose condition is a range on x, with
// f = now×Rate − Max and c = now×Rate − n:
//
//   - partial form, for a bucket that is not full: condition f ≤ x ≤ c, update
//     x = x + n (an absent item counts as x = f);
//   - full form, for a bucket that is full (or an absent item): condition
//     x ≤ f, update x = f + n.
//
// Neither condition names a time or an exact previous value, so concurrent
// takes on one key, from any number of instances, succeed together as long
// as units remain: DynamoDB applies each conditional write atomically on the
// item, and the bucket is exact under any concurrency (tested: 4 clients × 64
// goroutines on one key of 100 admit exactly 100). The numbers reach 2^104;
// DynamoDB's numbers hold 38 digits.
//
// The form is picked from what the Store saw of the key last (a table of
// 1,024 keys per Store): a new or idle key gets the full form, a key drained
// recently the partial one. When the condition fails, DynamoDB returns the
// item with the failure (ReturnValuesOnConditionCheckFailure; a server that
// does not, like dynalite, gets one strongly consistent GetItem), and the item
// decides on the Store's clock: a take it cannot afford is refused, with
// nothing written; otherwise the other form is sent, or, for an item that
// Update did not write at this rate (a record written by Set, a changed
// RefillRate), an UpdateItem conditioned on the item being unchanged. A
// condition that fails because another instance changed the item in between
// is retried with the item it failed on, up to [Config.MaxAttempts]
// conditional writes in all ([DefaultMaxAttempts], 4); beyond that Update
// returns [ErrContention], having written nothing. In practice a retry is
// rare: only exact-value conditions can fail under contention, and they are
// used only for items that Update did not write.
//
// Peek is one strongly consistent GetItem. Refund reads the item the same
// way and writes with a conditional UpdateItem (or a conditional DeleteItem
// when the bucket is full again). Reset (Store.Delete) is one DeleteItem.
//
// # Time and clock skew
//
// DynamoDB has no clock that a request can read, so every decision uses the
// clock of the instance that makes it ([Config.Now], time.Now by default),
// or the item's own time when that clock is behind it: a decision never runs
// at a time before the last one written to its item, so the decisions on a
// key are those of [kvstore.Refill.Apply] in the order DynamoDB applied
// them, and one instance's concurrent decisions are linearizable. Let S be
// the largest difference between the clocks of the instances sharing a
// table:
//
//   - an instance whose clock is ahead by S sees up to S × RefillRate more
//     units than the bucket holds in true time, and one behind decides at the
//     time of the item it reads until its clock catches up;
//   - so over any span of time the limiter admits at most
//     Burst + RefillRate × (span + S): skew adds at most S × RefillRate
//     admissions, once, not per period, and costs nothing while no request
//     straddles the difference.
//
// It tolerates a skew S below [TTLMargin] (a minute) with that bound; beyond
// it, DynamoDB may delete an item that a slow instance still counts, which
// then reads as a full bucket (up to Burst more). Instances whose clocks are
// synchronised (Lambda and EC2 run on the Amazon Time Sync Service) differ by
// milliseconds: for a RefillRate below one token per millisecond, less than
// a token. With a fixed clock in tests, the guarantees are exactly those of
// kvstore.Refill.Apply.
//
// # Eventual mode
//
// tokenbucket's Eventual mode needs only Get and Set: one GetItem, then one
// PutItem (or DeleteItem) when the request is admitted; a denial writes
// nothing. Its overshoot is what the tokenbucket package documents for any
// store: racing instances overwrite each other's takes, up to one bucket per
// instance racing in lock step. DynamoDB adds:
//
//   - with [Config.EventuallyConsistentReads], a Get may miss writes made in
//     about the last second (AWS documents no bound), which widens the race
//     window from one round trip to that; reads cost half;
//   - on a global table (replicas in several regions, each accepting
//     writes), a write reaches the other regions after the replication lag
//     (typically about a second, longer under load or a regional fault),
//     and concurrent writes to one item in two regions are resolved by last
//     writer wins: each region's limiter counts
//     its own takes, and a burst split between regions can admit up to one
//     bucket per region per replication lag. This is the edge key-value
//     pattern. Atomic mode on a global table is exact per region, and across
//     regions behaves like Eventual mode with the replication lag as the race
//     window: conditions are evaluated on the region's replica.
//
// Atomic mode costs less than Eventual on DynamoDB (one write, no read) and
// is exact: prefer it unless the table is global.
//
// # Cost
//
// An item stays below 1 KB for keys below about 900 bytes (ratekit's keys
// are at most 512), so each write is one write request unit (WRU), a
// strongly consistent read one read request unit (RRU), an eventually
// consistent read half of one. A failed condition is billed as a write.
//
//	decision                                   requests          units
//	Atomic take, admitted or refused           1 UpdateItem      1 WRU
//	  wrong form guessed (new instance, key     2 UpdateItem      2 WRU
//	  drained by another one), or a record
//	  Update did not write
//	Atomic take refused by the denied cache    none              0
//	Peek                                       1 GetItem         1 RRU
//	Refund                                     GetItem + write   1 RRU + 1 WRU
//	Reset                                      1 DeleteItem      1 WRU
//	Eventual take, admitted                    GetItem + write   1 (or ½) RRU + 1 WRU
//	Eventual take, refused                     1 GetItem         1 (or ½) RRU
//
// At on-demand list prices in us-east-1 ($0.625 per million WRU, $0.125 per
// million RRU), a million Atomic decisions cost $0.625 when each is one
// request, $1.25 if every one guessed wrong; Eventual costs $0.75 per million
// admitted decisions ($0.6875 with eventually consistent reads). Storage is a
// few dozen bytes per active key, deleted by Time to Live at no charge. A
// global table bills each write again in every replica region.
//
// # Errors and timeouts
//
// Every request is sent once: the Store turns the SDK's retries off for its
// requests, because a write whose response was lost may have been applied,
// and sending it again would take twice. Throttling
// (*types.ProvisionedThroughputExceededException, ThrottlingException), a
// missing table (*types.ResourceNotFoundException), refused credentials
// (UnrecognizedClientException; match smithy.APIError's ErrorCode), server
// errors and network failures are returned at once, wrapped, for the
// caller's failure policy (httplimit.GuardConfig.OnError). An error caused by
// the caller's context wraps ctx.Err(). Give every decision a deadline
// (httplimit.GuardConfig.Timeout, or the invocation's): the SDK's HTTP client
// has no per-request timeout of its own, and a connection that died without
// a word (a NAT that dropped the flow while the instance was frozen) is
// noticed only at the deadline. A request sent on a pooled connection just
// as the server closes it for idleness fails too, and is not retried (it may
// have been written); an http.Transport whose IdleConnTimeout is below the
// server's idle timeout retires connections before that race.
package dynamostore
