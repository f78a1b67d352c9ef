package lambda

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/ratekit/ratekit"
)

// EMFConfig configures [NewEMFObserver]. The zero EMFConfig writes to
// standard output in the namespace "ratekit".
type EMFConfig struct {
	// Logger writes the metric lines. Its handler must write each record as
	// one JSON object with the attributes at the top level, as
	// slog.NewJSONHandler does (no WithGroup): CloudWatch reads the _aws
	// member and the metric values there. Nil means a JSON handler on
	// standard output, which Lambda sends to CloudWatch Logs.
	Logger *slog.Logger

	// Namespace is the CloudWatch namespace of the metrics: at most 255
	// ASCII letters, digits and the characters . - _ / # :, not starting
	// with the reserved "AWS/". Empty means "ratekit".
	Namespace string
}

// NewEMFObserver returns a [ratekit.Observer] that writes what limiters
// decide as CloudWatch Embedded Metric Format lines through cfg.Logger, so
// that CloudWatch extracts metrics from the function's logs with no agent
// and no API call. Use it with [ratekit.Observe] (decisions) and
// httplimit.GuardConfig (Observer, failure-policy events).
//
// Each decision is one log record at level Info with message
// "ratekit decision", the dimensions Policy ("unknown" when the limiter
// reports none), Operation (allow, peek, refund)
// and Outcome (allowed, denied, error), and the metrics Decisions (Count, 1)
// and DecisionLatency (Milliseconds); a decision that failed because the
// store failed or was too slow also carries StoreErrors (Count, 1), and every
// failed decision the property ErrorType ([ratekit.ErrorClass.String]). Each
// failure-policy action is a record with message "ratekit failure policy",
// dimensions Policy and Action (fail_open, fail_closed, fallback), the
// metric FailurePolicyEvents (Count, 1) and the property ErrorType.
//
// One line per decision rather than one per invocation: a Lambda
// invocation makes one decision, so there is nothing to aggregate, and a
// line written at once survives a function that times out or crashes.
// CloudWatch bills each distinct combination of namespace, metric name and
// dimension values as one custom metric, and every dimension here takes few
// values (keys, client state and error messages are never written); the
// lines themselves are billed as log ingestion. See
// https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html.
//
// It returns an error matching [ratekit.ErrInvalidConfig] for an invalid
// Namespace. The Observer is safe for concurrent use when cfg.Logger is.
func NewEMFObserver(cfg EMFConfig) (*ratekit.Observer, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = "ratekit"
	}
	if err := validNamespace(cfg.Namespace); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(os.Stdout, nil))
	}
	e := &emf{log: cfg.Logger}
	decisionDims := []string{"Policy", "Operation", "Outcome"}
	var err1, err2, err3 error
	e.decision, err1 = directive(cfg.Namespace, decisionDims, "Decisions", "Count", "DecisionLatency", "Milliseconds")
	e.storeErr, err2 = directive(cfg.Namespace, decisionDims, "Decisions", "Count", "DecisionLatency", "Milliseconds", "StoreErrors", "Count")
	e.failure, err3 = directive(cfg.Namespace, []string{"Policy", "Action"}, "FailurePolicyEvents", "Count")
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, fmt.Errorf("lambda: EMF directive: %w", err)
	}
	return &ratekit.Observer{Decision: e.onDecision, FailurePolicy: e.onFailure}, nil
}

type emf struct {
	log *slog.Logger
	// The CloudWatchMetrics members, encoded once.
	decision, storeErr, failure json.RawMessage
}

type emfDirective struct {
	Namespace  string      `json:"Namespace"`
	Dimensions [][]string  `json:"Dimensions"`
	Metrics    []emfMetric `json:"Metrics"`
}

type emfMetric struct {
	Name string `json:"Name"`
	Unit string `json:"Unit"`
}

// directive returns the encoded CloudWatchMetrics array for one dimension
// set and the metrics given as name, unit pairs.
func directive(namespace string, dims []string, nameUnit ...string) (json.RawMessage, error) {
	d := emfDirective{Namespace: namespace, Dimensions: [][]string{dims}}
	for i := 0; i+1 < len(nameUnit); i += 2 {
		d.Metrics = append(d.Metrics, emfMetric{Name: nameUnit[i], Unit: nameUnit[i+1]})
	}
	return json.Marshal([]emfDirective{d})
}

// dimension returns v, or "unknown" for "": CloudWatch refuses empty
// dimension values.
func dimension(v string) string {
	if v == "" {
		return "unknown"
	}
	return v
}

func aws(now time.Time, metrics json.RawMessage) slog.Attr {
	return slog.Group("_aws", slog.Int64("Timestamp", now.UnixMilli()), slog.Any("CloudWatchMetrics", metrics))
}

func (e *emf) onDecision(ctx context.Context, d ratekit.DecisionEvent) {
	metrics := e.decision
	storeErr := d.ErrorClass == ratekit.ErrorStore || d.ErrorClass == ratekit.ErrorDeadline
	if storeErr {
		metrics = e.storeErr
	}
	attrs := []slog.Attr{
		aws(time.Now(), metrics),
		slog.String("Policy", dimension(d.Policy)),
		slog.String("Operation", d.Op.String()),
		slog.String("Outcome", d.Outcome.String()),
		slog.Int("Decisions", 1),
		slog.Float64("DecisionLatency", float64(d.Duration.Nanoseconds())/1e6),
	}
	if storeErr {
		attrs = append(attrs, slog.Int("StoreErrors", 1))
	}
	if d.ErrorClass != ratekit.ErrorNone {
		attrs = append(attrs, slog.String("ErrorType", d.ErrorClass.String()))
	}
	e.log.LogAttrs(ctx, slog.LevelInfo, "ratekit decision", attrs...)
}

func (e *emf) onFailure(ctx context.Context, f ratekit.FailureEvent) {
	e.log.LogAttrs(ctx, slog.LevelInfo, "ratekit failure policy",
		aws(time.Now(), e.failure),
		slog.String("Policy", dimension(f.Policy)),
		slog.String("Action", f.Action.String()),
		slog.Int("FailurePolicyEvents", 1),
		slog.String("ErrorType", f.ErrorClass.String()),
	)
}

// validNamespace checks a CloudWatch namespace.
func validNamespace(ns string) error {
	if strings.HasPrefix(ns, "AWS/") {
		return configErr("EMF namespace %q: the AWS/ prefix is reserved", ns)
	}
	if len(ns) > 255 {
		return configErr("EMF namespace is %d bytes, at most 255", len(ns))
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.', c == '-', c == '_', c == '/', c == '#', c == ':':
		default:
			return configErr("EMF namespace %q has byte %q; use letters, digits, '.', '-', '_', '/', '#' or ':'", ns, c)
		}
	}
	return nil
}
