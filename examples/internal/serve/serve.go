// Package serve runs the examples' HTTP servers until their context ends.
package serve

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Grace is how long requests in flight get to finish once the context ends.
const Grace = 5 * time.Second

// Run serves srv on ln until ctx ends, then shuts it down: requests in
// flight get Grace to finish, after which the connections still open (a
// request still running, or a socket a browser opened ahead of time and
// never used, which the server counts as busy for its first 5 s) are
// closed. Stopping is not a failure: Run returns nil after ctx ends, and
// the error that stopped the server otherwise.
func Run(ctx context.Context, srv *http.Server, ln net.Listener, logger *slog.Logger) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), Grace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); errors.Is(err, context.DeadlineExceeded) {
		logger.Warn("closing connections still open after the grace period", "grace", Grace)
		if err := srv.Close(); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
