package lambda

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
)

// SourceIPKey returns a KeyFunc that keys invocations by the client address
// API Gateway or the function URL recorded (Request.SourceIP), as a
// [httplimit.IPKey]: the key [httplimit.RemoteAddrKey] computes for the same
// client behind the root middleware. API Gateway and function URLs take the
// address from the TCP connection, so the client cannot choose it.
//
// ALB events carry no source IP: the KeyFunc returns an error matching
// [httplimit.ErrNoKey] for them (use [ForwardedForKey]), and for an address
// that does not parse.
func SourceIPKey() KeyFunc {
	return func(_ context.Context, r *Request) (string, error) {
		if r.SourceIP == "" {
			return "", fmt.Errorf("lambda: %w: the event carries no source IP (ALB events: use ForwardedForKey)", httplimit.ErrNoKey)
		}
		return httplimit.ParseIPKey(r.SourceIP)
	}
}

// ForwardedForKey returns a KeyFunc that keys invocations by the right-most
// untrusted X-Forwarded-For entry, as [httplimit.ForwardedForKey] does:
// trustedProxies is the number of proxies that append to the field, counting
// the one that invokes the function (1 for an ALB that clients reach
// directly, 2 with CloudFront in front of it). This is the key function for
// ALB events, which carry no source IP.
//
// It returns an error matching [ratekit.ErrInvalidConfig] when
// trustedProxies is below 1; the KeyFunc returns an error matching
// [httplimit.ErrNoKey] when the field has fewer entries or that entry is not
// an IP address.
func ForwardedForKey(trustedProxies int) (KeyFunc, error) {
	if trustedProxies < 1 {
		return nil, configErr("ForwardedForKey needs at least 1 trusted proxy, got %d", trustedProxies)
	}
	return func(_ context.Context, r *Request) (string, error) {
		return httplimit.ForwardedForClient(r.Header.Values("X-Forwarded-For"), trustedProxies)
	}, nil
}

// APIKeyHeaderKey returns a KeyFunc that keys invocations by an API key in
// the named header field (any case), hashed by [httplimit.APIKey] exactly as
// [httplimit.APIKeyHeaderKey] hashes it. It returns an error matching
// [ratekit.ErrInvalidConfig] for an invalid field name; the KeyFunc returns
// an error matching [httplimit.ErrNoKey] when the field is missing or empty.
func APIKeyHeaderKey(name string) (KeyFunc, error) {
	if _, err := httplimit.APIKeyHeaderKey(name); err != nil {
		return nil, configErr("%v", err)
	}
	name = http.CanonicalHeaderKey(name)
	return func(_ context.Context, r *Request) (string, error) {
		return httplimit.APIKey(r.Header.Get(name))
	}, nil
}

// GatewayAPIKey returns a KeyFunc that keys API Gateway REST API
// invocations by the API key that API Gateway validated
// (requestContext.identity.apiKey, present on methods that require an API
// key), hashed by [httplimit.APIKey], so it agrees with [APIKeyHeaderKey] on
// the X-Api-Key field that carries the same key. The KeyFunc returns an
// error matching [httplimit.ErrNoKey] for other event types and when the
// event carries no API key.
func GatewayAPIKey() KeyFunc {
	return func(_ context.Context, r *Request) (string, error) {
		ev, ok := r.Event.(*events.APIGatewayProxyRequest)
		if !ok {
			return "", fmt.Errorf("lambda: %w: only API Gateway REST events carry a validated API key", httplimit.ErrNoKey)
		}
		return httplimit.APIKey(ev.RequestContext.Identity.APIKey)
	}
}

// ClaimKey returns a KeyFunc that keys invocations by a claim of the
// caller's identity that an API Gateway authorizer verified, such as the JWT
// subject "sub". The key is "claim:" + name + "=" + value. It reads
//
//   - HTTP APIs: requestContext.authorizer.jwt.claims (JWT authorizers),
//     then requestContext.authorizer.lambda (Lambda authorizer context);
//   - REST APIs: requestContext.authorizer.claims (Cognito user pool
//     authorizers), then requestContext.authorizer itself (Lambda
//     authorizer context, including principalId).
//
// String, number and boolean values are accepted. Only use claims that an
// authorizer verified: the event's headers are the client's to choose. It
// returns an error matching [ratekit.ErrInvalidConfig] for an empty name;
// the KeyFunc returns an error matching [httplimit.ErrNoKey] when the event
// has no such claim (and for function URL and ALB events, which have no
// authorizer claims).
func ClaimKey(name string) (KeyFunc, error) {
	if name == "" {
		return nil, configErr("ClaimKey needs a claim name")
	}
	return func(_ context.Context, r *Request) (string, error) {
		v, ok := claim(r.Event, name)
		if !ok || v == "" {
			return "", fmt.Errorf("lambda: %w: no authorizer claim %q", httplimit.ErrNoKey, name)
		}
		return "claim:" + name + "=" + v, nil
	}, nil
}

func claim(event any, name string) (string, bool) {
	switch ev := event.(type) {
	case *events.APIGatewayV2HTTPRequest:
		a := ev.RequestContext.Authorizer
		if a == nil {
			return "", false
		}
		if a.JWT != nil {
			if v, ok := a.JWT.Claims[name]; ok {
				return v, true
			}
		}
		return scalar(a.Lambda[name])
	case *events.APIGatewayProxyRequest:
		a := ev.RequestContext.Authorizer
		if claims, ok := a["claims"].(map[string]any); ok {
			if v, ok := scalar(claims[name]); ok {
				return v, true
			}
		}
		return scalar(a[name])
	}
	return "", false
}

// scalar formats a JSON string, number or boolean.
func scalar(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	case bool:
		return strconv.FormatBool(v), true
	}
	return "", false
}

// HTTPKey adapts a [httplimit.KeyFunc] of the root package to invocations: it
// calls kf with an *http.Request that carries the invocation's context,
// Method, Path, Header and, as RemoteAddr, the SourceIP (without a port, as
// [httplimit.RemoteAddrKey] accepts). Use it to share one key function
// between a Lambda adapter and a [httplimit.Middleware].
func HTTPKey(kf httplimit.KeyFunc) KeyFunc {
	return func(ctx context.Context, r *Request) (string, error) {
		hr := &http.Request{
			Method:     r.Method,
			URL:        &url.URL{Path: r.Path},
			Header:     r.Header,
			RemoteAddr: r.SourceIP,
		}
		return kf(hr.WithContext(ctx))
	}
}

// EventKey returns a KeyFunc that calls f with the typed event, for keys
// that need fields this package does not read (a path parameter, a tenant
// from a custom authorizer). f receives a pointer to the event and must not
// modify it. For invocations of another event type the KeyFunc returns an
// error matching [httplimit.ErrNoKey]; so does f, by convention, when the
// event carries no usable key.
func EventKey[E any](f func(ctx context.Context, event *E) (string, error)) KeyFunc {
	return func(ctx context.Context, r *Request) (string, error) {
		ev, ok := r.Event.(*E)
		if !ok {
			return "", fmt.Errorf("lambda: %w: key function expects %T, got %T", httplimit.ErrNoKey, ev, r.Event)
		}
		return f(ctx, ev)
	}
}

// HeaderValue returns a function that reads the named header field (any
// case, surrounding white space trimmed), for Config.IdempotencyKey, as in
// HeaderValue("Idempotency-Key") (draft-ietf-httpapi-idempotency-key-header).
// A field longer than [ratekit.MaxKeyLen] plus 256 bytes is returned as it
// is, without being read, so that it is refused as too long
// ([ratekit.ErrKeyTooLong]) at a cost that does not grow with its size.
func HeaderValue(name string) func(*Request) string {
	name = http.CanonicalHeaderKey(name)
	return func(r *Request) string {
		v := r.Header.Get(name)
		if len(v) > ratekit.MaxKeyLen+256 {
			return v
		}
		return strings.TrimSpace(v)
	}
}
