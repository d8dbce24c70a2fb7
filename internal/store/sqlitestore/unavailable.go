package sqlitestore

import (
	"database/sql"
	"errors"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// IsUnavailable reports whether err means the SQLite database could not
// serve the call now (store.ErrUnavailable): its file is locked by another
// process past the busy timeout (SQLITE_BUSY, SQLITE_LOCKED), the disk
// failed or is full (SQLITE_IOERR*, SQLITE_FULL), the file cannot be
// opened (SQLITE_CANTOPEN), or the connection is gone. A statement's own
// error (a constraint, bad input) is not.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var e *sqlite.Error
	if errors.As(err, &e) {
		switch e.Code() & 0xff { // the primary code of an extended one
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR,
			sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN:
			return true
		}
		return false
	}
	return errors.Is(err, sql.ErrConnDone)
}
