package lambda

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/ratekit/ratekit"
)

const setCookie = "Set-Cookie"

// ErrConflictingHeader is returned by [EventHeader], and answered with 400
// by the adapters, for an event that carries two copies of one header field
// under names that differ in case only (x-api-key and X-Api-Key) with
// different values. API Gateway, function URLs and ALBs never send such
// events; a direct Invoke can. It matches [ratekit.ErrInvalidRequest].
var ErrConflictingHeader error = &conflictingHeaderError{}

// conflictingHeaderError is ErrConflictingHeader's type: a pointer to it in
// a package-level variable is laid out by the linker, so the error costs
// nothing at package initialisation (fmt.Errorf would run there).
type conflictingHeaderError struct{}

func (*conflictingHeaderError) Error() string {
	return "invalid request: conflicting copies of a header field"
}

func (*conflictingHeaderError) Unwrap() error { return ratekit.ErrInvalidRequest }

// EventHeader returns the header fields of event, a pointer to one of the
// four event types the adapters take (*events.APIGatewayProxyRequest,
// *events.APIGatewayV2HTTPRequest, *events.LambdaFunctionURLRequest,
// *events.ALBTargetGroupRequest), as the adapters see them
// ([Request.Header]): under canonical names, from the multi-value map when
// the event has one with entries and the single-value map otherwise, with
// the event's separate cookie list added as a Cookie field.
//
// Copies of one field whose names differ in case only are one field when
// their values are equal, and make EventHeader return an error matching
// [ErrConflictingHeader] when they differ, so that every reader of the event
// sees the same value. Code that reads header fields of the event outside
// the adapter (authentication in front of it, say) should read them through
// EventHeader, so that the value it checks is the value the adapter keys and
// charges. It returns an error matching [ratekit.ErrInvalidConfig] for any
// other type of event. The returned Header shares no slice with event.
func EventHeader(event any) (http.Header, error) {
	switch ev := event.(type) {
	case *events.APIGatewayProxyRequest:
		return eventHeader(ev.Headers, ev.MultiValueHeaders, nil)
	case *events.APIGatewayV2HTTPRequest:
		return eventHeader(ev.Headers, nil, ev.Cookies)
	case *events.LambdaFunctionURLRequest:
		return eventHeader(ev.Headers, nil, ev.Cookies)
	case *events.ALBTargetGroupRequest:
		return eventHeader(ev.Headers, ev.MultiValueHeaders, nil)
	}
	return nil, configErr("EventHeader: unsupported event type %T", event)
}

// eventHeader builds an http.Header with canonical names from an event's
// header maps: multi when it has entries (it then holds every value), single
// otherwise. cookies, the separate cookie list of HTTP API and function URL
// events, is added as one Cookie field line. Names that differ in case only
// are merged when their values are equal and refused when they differ.
func eventHeader(single map[string]string, multi map[string][]string, cookies []string) (http.Header, error) {
	h := make(http.Header, max(len(single), len(multi))+1)
	if len(multi) > 0 {
		for name, values := range multi {
			k := http.CanonicalHeaderKey(name)
			if prev, ok := h[k]; ok {
				if !slices.Equal(prev, values) {
					return nil, fmt.Errorf("%w: %s", ErrConflictingHeader, k)
				}
				continue
			}
			h[k] = slices.Clone(values)
		}
	} else {
		// One backing array for all the single values.
		backing := make([]string, 0, len(single))
		for name, value := range single {
			k := http.CanonicalHeaderKey(name)
			if prev, ok := h[k]; ok {
				if prev[0] != value {
					return nil, fmt.Errorf("%w: %s", ErrConflictingHeader, k)
				}
				continue
			}
			backing = append(backing, value)
			h[k] = backing[len(backing)-1 : len(backing) : len(backing)]
		}
	}
	if len(cookies) > 0 {
		h["Cookie"] = append(h["Cookie"], strings.Join(cookies, "; "))
	}
	return h, nil
}

// findKey returns the key of m equal to name ignoring case, and whether
// there is one.
func findKey[V any](m map[string]V, name string) (string, bool) {
	if _, ok := m[name]; ok {
		return name, true
	}
	for k := range m {
		if strings.EqualFold(k, name) {
			return k, true
		}
	}
	return "", false
}

// mergeSingle adds the fields of dst other than Set-Cookie to h, a
// single-value header map, skipping names that h or other (the response's
// other header map, may be nil) already holds: the handler's own fields win,
// as they do behind httplimit.Middleware.
func mergeSingle(h map[string]string, other map[string][]string, dst http.Header) map[string]string {
	for name, values := range dst {
		if name == setCookie || len(values) == 0 {
			continue
		}
		if _, ok := findKey(h, name); ok {
			continue
		}
		if _, ok := findKey(other, name); ok {
			continue
		}
		if h == nil {
			h = make(map[string]string, len(dst))
		}
		h[name] = strings.Join(values, ", ")
	}
	return h
}

// mergeMulti is mergeSingle for a multi-value header map.
func mergeMulti(h map[string][]string, other map[string]string, dst http.Header) map[string][]string {
	for name, values := range dst {
		if name == setCookie || len(values) == 0 {
			continue
		}
		if _, ok := findKey(h, name); ok {
			continue
		}
		if _, ok := findKey(other, name); ok {
			continue
		}
		if h == nil {
			h = make(map[string][]string, len(dst))
		}
		h[name] = append([]string(nil), values...)
	}
	return h
}

// mergeREST merges dst into an API Gateway REST response.
func mergeREST(resp *events.APIGatewayProxyResponse, dst http.Header) {
	if resp.Headers == nil && resp.MultiValueHeaders != nil {
		resp.MultiValueHeaders = mergeMulti(resp.MultiValueHeaders, nil, dst)
	} else {
		resp.Headers = mergeSingle(resp.Headers, resp.MultiValueHeaders, dst)
	}
	cookies := dst[setCookie]
	if len(cookies) == 0 {
		return
	}
	var all []string
	if k, ok := findKey(resp.Headers, setCookie); ok {
		all = append(all, resp.Headers[k])
		delete(resp.Headers, k)
	}
	k, ok := findKey(resp.MultiValueHeaders, setCookie)
	if !ok {
		k = setCookie
	}
	if resp.MultiValueHeaders == nil {
		resp.MultiValueHeaders = make(map[string][]string, 1)
	}
	resp.MultiValueHeaders[k] = append(append(resp.MultiValueHeaders[k], all...), cookies...)
}

// mergeCookieForm merges dst into the Headers and Cookies of an HTTP API or
// function URL response.
func mergeCookieForm(h map[string]string, cookies []string, dst http.Header) (map[string]string, []string) {
	return mergeSingle(h, nil, dst), append(cookies, dst[setCookie]...)
}

// mergeALB merges dst into an ALB response in the form the request used.
func mergeALB(resp *events.ALBTargetGroupResponse, dst http.Header, multi bool) {
	if multi {
		resp.MultiValueHeaders = mergeMulti(resp.MultiValueHeaders, nil, dst)
		if cookies := dst[setCookie]; len(cookies) > 0 {
			k, ok := findKey(resp.MultiValueHeaders, setCookie)
			if !ok {
				k = setCookie
			}
			if resp.MultiValueHeaders == nil {
				resp.MultiValueHeaders = make(map[string][]string, 1)
			}
			resp.MultiValueHeaders[k] = append(resp.MultiValueHeaders[k], cookies...)
		}
		return
	}
	resp.Headers = mergeSingle(resp.Headers, nil, dst)
	if cookies := dst[setCookie]; len(cookies) > 0 {
		if _, ok := findKey(resp.Headers, setCookie); !ok {
			if resp.Headers == nil {
				resp.Headers = make(map[string]string, 1)
			}
			resp.Headers[setCookie] = cookies[0]
		}
	}
}
