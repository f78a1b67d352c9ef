// Package lambda puts any [ratekit.Limiter] in front of an AWS Lambda handler
// for the four HTTP-shaped events of github.com/aws/aws-lambda-go/events:
//
//   - API Gateway REST APIs: [Adapter.REST] (APIGatewayProxyRequest)
//   - API Gateway HTTP APIs: [Adapter.HTTPAPI] (APIGatewayV2HTTPRequest)
//   - Lambda function URLs: [Adapter.FunctionURL] (LambdaFunctionURLRequest)
//   - Application Load Balancer target groups: [Adapter.ALB]
//     (ALBTargetGroupRequest, single-value or multi-value headers)
//
// Each wrapper takes and returns the event's own handler type, so the result
// goes straight to lambda.Start. The HTTP answers come from the same code as
// the root package's net/http httplimit.Middleware, a httplimit.Guard: the
// RateLimit and RateLimit-Policy header fields, Retry-After, the
// application/problem+json bodies of 429, 503 and 400 answers, the client
// state of stateless strategies in a header field and a cookie, and the
// failure policy. Keys agree across transports too: an IP key computed here
// is the httplimit.IPKey the middleware computes for the same client, and an
// API key is hashed by httplimit.APIKey in both.
//
// # Request flow
//
// For every invocation the wrapper builds a [Request] (the event's header
// fields under canonical names, whatever case the event used, its cookies
// and its source IP; an event with differing copies of one field under
// differently-cased names gets 400, and code in front of the adapter reads
// the same fields with [EventHeader]), derives the key with [Config.Key], reads the client
// state with httplimit.Guard.State and calls httplimit.Guard.Check with the
// invocation's context. Each limiter call ends by the earlier of
// httplimit.GuardConfig.Timeout and the invocation deadline minus
// httplimit.GuardConfig.DeadlineMargin, so a store that does not answer ends
// in the failure policy's answer (503 under FailClosed) before Lambda would
// end the invocation with "Task timed out"; with UseFallback the fallback
// gets time before that bound too. An invocation whose context has already
// ended is no limiter failure: it gets 503, the handler does not run and no
// failure policy applies, not even FailOpen. When the request
// may proceed, the handler runs with the [ratekit.Decision] in its context
// (httplimit.DecisionFromContext) and the [ratekit.Request] that was charged
// (httplimit.RequestFromContext, for refunds), and the header fields of the decision
// are merged into its response: fields the handler set itself are kept,
// Set-Cookie goes where the event type expects cookies. Otherwise the wrapper
// answers in the event's response type with the Guard's status and body and
// the handler does not run.
//
// # Cold starts, frozen instances and connection pools
//
// Build the limiter, the httplimit.Guard and the [Adapter] once, in main or
// in a package-level variable, before calling lambda.Start: the instance
// then reuses them (and their connection pool) for every invocation it
// serves, and an invocation pays for none of the set-up. Nothing in this
// package or in ratekit's strategies starts a goroutine or a timer: between
// invocations Lambda freezes the instance, and a background ticker would
// neither run while frozen nor catch up correctly when thawed. Every
// strategy computes its state lazily from a clock at the moment it decides,
// so an instance thawed after an hour decides as a fresh one would.
//
// Size pools by the number of invocations one instance runs at once, which
// aws-lambda-go reports as lambdacontext.MaxConcurrency() (1 on standard
// Lambda, where an instance serves one request at a time; more with Lambda
// managed instances): a Redis pool of PoolSize MaxConcurrency() and a pgxpool
// MaxConns of MaxConcurrency() are enough, and anything larger only holds
// connections the database has to account for across every instance. A
// frozen instance keeps its TCP connections, but the server, a proxy or a NAT
// may drop them while it sleeps, often without a FIN or RST (AWS's NAT
// gateway after 350 s idle), so that after the thaw they look open and
// answer nothing. So:
//
//   - pgx: build the pool with pgstore.ServerlessPoolConfig(cfg, timeout),
//     passing the Guard's Timeout: it pings connections idle for more than a
//     second within timeout/4, closes the ones that sat through the same
//     silence, frees a broken connection's pool slot at once instead of
//     after pgx's 15-second drain, and retires idle connections after a
//     minute; use default_query_exec_mode=exec behind RDS Proxy or
//     PgBouncer (see package pgstore).
//   - go-redis: build the client with redisstore.ServerlessOptions, which
//     makes commands honour the context deadline, retires connections idle
//     for a minute, and replaces the pooled connections that sat through the
//     same silence as one whose command went unanswered.
//
// After a thaw in which every pooled connection went silent, at most one
// decision then fails (at the Guard's Timeout: nothing tells a silent
// connection from a slow server sooner), the failure policy of the Guard
// decides what the client sees, and the next decisions run on new
// connections. (pgxpool runs a health-check goroutine of its own; it is
// frozen with the instance and does no harm, since the ping before use is
// what protects a thawed instance.)
package lambda
