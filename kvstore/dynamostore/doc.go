// Package dynamostore is a [kvstore.Store], [kvstore.Atomic],
// [kvstore.PeriodCounter], [kvstore.PeriodHistory] and
// [kvstore.IdempotentMulti] on Amazon DynamoDB, through aws-sdk-go-v2's [dynamodb.Client]: a token bucket on the
// store that AWS Lambda functions already have, with no server to run, size
// or keep warm, billed per request. It is a module of its own, so the AWS SDK
// enters the module graph only of programs that import it.
//
// It needs one table with on-demand billing, partition key [KeyAttribute]
// ("pk") of type Binary, no sort key, and Time to Live on [TTLAttribute]
// ("ttl"). [CreateTable] creates one for tests and local use. Each key is
// one item, and a decision reads or writes only that item.
//
// In tokenbucket's Atomic mode a take is one conditional UpdateItem in the
// common case. It is exact under any concurrency, from any number of
// instances. When other instances keep changing the item, Update gives up
// after [Config.MaxAttempts] conditional writes with an error matching
// [ErrContention], having written nothing. Eventual mode is one GetItem and,
// when admitted, one write, with the overshoot that package tokenbucket
// documents; eventually consistent reads and global tables widen its race
// window. Atomic mode is cheaper and exact: prefer it unless the table is
// global.
//
// A group of [Store.UpdateMulti] is one item holding every record of the
// group, token buckets and calendar-period counters: a plan's burst and
// monthly quota are decided all or nothing by one conditional UpdateItem,
// with no transaction (dynalite has none; on AWS they bill double). The
// write that moves a counter into a later period keeps the ended period in
// the item, and the same call writes it as a history item of its own,
// kept for [Config.HistoryTTL]; [Store.PeriodUsage] scans both.
// [Store.UpdateMultiOnce] records idempotency keys in the group item, in
// the decision's write, and moves them to items of their own.
//
// DynamoDB has no clock a request can read, so each decision uses the clock
// of its instance ([Config.Now]). If the clocks of the instances sharing a
// table differ by at most S, the limiter admits at most
// Burst + RefillRate × (span + S) over any span, for S below [TTLMargin].
// At a period's boundary an instance ahead starts the next period, and one
// behind then counts into it, never into a fresh one; a group item last
// written more than [MaxClockAhead] ahead of an instance's clock is refused
// with an error matching ratekit.ErrClockSkew.
//
// Every request is sent once: the Store turns the SDK's retries off, because
// a write whose response was lost may have been applied. Throttling, a
// missing table, refused credentials and network failures are returned at
// once, wrapped. An error caused by the caller's context wraps ctx.Err().
// Give every decision a deadline: the SDK's HTTP client has none of its own.
//
// See docs/dynamodb.md in the repository for the table template, the
// conditional-write arithmetic, clock skew, global tables, the cost of each
// decision and timeouts.
package dynamostore
