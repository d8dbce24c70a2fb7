package pgstore

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATEs of a server that cannot serve now: connection exceptions (class
// 08), too many connections, and the shutdown codes. A call refused with
// one of them may succeed later; nothing in its transaction was committed.
const (
	classConnectionException = "08"
	codeTooManyConnections   = "53300"
	codeAdminShutdown        = "57P01"
	codeCrashShutdown        = "57P02"
	codeCannotConnectNow     = "57P03"
)

// IsUnavailable reports whether err means the PostgreSQL server could not
// be reached or would not serve (store.ErrUnavailable): a failed connect
// (refused, timed out, DNS), a connection lost or closed mid-call, a
// network error, or the server refusing with a connection-exception or
// shutdown SQLSTATE (08xxx, 53300, 57P01–57P03). A query's own error (a
// constraint, bad input) is not, nor a call its caller cancelled (a client
// that hung up): that says nothing of the store, and counting it would
// give every instance an outage grace (DESIGN L8) each time one did.
func IsUnavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeTooManyConnections, codeAdminShutdown, codeCrashShutdown, codeCannotConnectNow:
			return true
		}
		return strings.HasPrefix(pgErr.Code, classConnectionException)
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, pgconn.ErrConnClosed) || pgconn.Timeout(err) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}
