// Package apigwlocal serves a Lambda handler for API Gateway HTTP APIs
// (payload format 2.0) over plain HTTP, so that an example's -local mode
// runs the very handler that runs on Lambda.
package apigwlocal

import (
	"context"
	"encoding/base64"
	"github.com/ratekit/ratekit/examples/internal/serve"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"

	"github.com/ratekit/ratekit/lambda"
)

// maxBody bounds a request body in local mode, as API Gateway does (10 MB).
const maxBody = 10 << 20

// Handler serves h over plain HTTP: each request becomes the
// APIGatewayV2HTTPRequest that an HTTP API would send (lower-case header
// names, cookies in their own list, the peer address as source IP), so the
// handler under test is the one that runs on Lambda.
func Handler(h lambda.HTTPAPIHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		ev := events.APIGatewayV2HTTPRequest{
			Version:        "2.0",
			RouteKey:       "$default",
			RawPath:        r.URL.Path,
			RawQueryString: r.URL.RawQuery,
			Headers:        map[string]string{},
		}
		for name, values := range r.Header {
			if name == "Cookie" {
				for _, line := range values {
					for _, c := range strings.Split(line, ";") {
						if c = strings.TrimSpace(c); c != "" {
							ev.Cookies = append(ev.Cookies, c)
						}
					}
				}
				continue
			}
			ev.Headers[strings.ToLower(name)] = strings.Join(values, ",")
		}
		if q := r.URL.Query(); len(q) > 0 {
			ev.QueryStringParameters = map[string]string{}
			for k, v := range q {
				ev.QueryStringParameters[k] = strings.Join(v, ",")
			}
		}
		if utf8.Valid(body) {
			ev.Body = string(body)
		} else {
			ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString(body), true
		}
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		ev.RequestContext.HTTP = events.APIGatewayV2HTTPRequestContextHTTPDescription{
			Method: r.Method, Path: r.URL.Path, Protocol: r.Proto, SourceIP: host, UserAgent: r.UserAgent(),
		}
		ev.RequestContext.Stage = "$default"
		ev.RequestContext.TimeEpoch = time.Now().UnixMilli()

		// A Lambda invocation has a deadline; so does this one.
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		resp, err := h(ctx, ev)
		if err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		for name, v := range resp.Headers {
			w.Header().Set(name, v)
		}
		for name, vs := range resp.MultiValueHeaders {
			for _, v := range vs {
				w.Header().Add(name, v)
			}
		}
		for _, c := range resp.Cookies {
			w.Header().Add("Set-Cookie", c)
		}
		out := []byte(resp.Body)
		if resp.IsBase64Encoded {
			if out, err = base64.StdEncoding.DecodeString(resp.Body); err != nil {
				http.Error(w, "bad base64 body", http.StatusInternalServerError)
				return
			}
		}
		w.WriteHeader(resp.StatusCode)
		w.Write(out)
	})
}

// Serve serves h on ln until ctx ends, then shuts the server down: requests
// in flight get 5 s to finish, after which the connections still open (a
// request still running, or a socket a browser opened ahead of time and
// never used, which the server counts as busy for its first 5 s) are
// closed. Stopping is not a failure: Serve returns nil after ctx ends.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, logger *slog.Logger) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	return serve.Run(ctx, srv, ln, logger)
}
