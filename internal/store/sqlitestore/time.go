package sqlitestore

import (
	"database/sql"
	"fmt"
	"time"
)

// timeLayout is the one format every time is stored in: UTC, fixed width,
// millisecond precision, so that string order is time order.
const timeLayout = "2006-01-02T15:04:05.000Z"

// utcMS is t in UTC truncated to the millisecond, the precision the store
// keeps. Incoming times pass through it before they are compared or written.
func utcMS(t time.Time) time.Time {
	return t.UTC().Truncate(time.Millisecond)
}

// timeString formats t for storage.
func timeString(t time.Time) string {
	return utcMS(t).Format(timeLayout)
}

// parseTime parses a stored time; the result is UTC.
func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(timeLayout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("stored time %q: %w", s, err)
	}
	return t, nil
}

// sqlAddMS is the SQL expression for the stored time expression t plus ms
// milliseconds (an integer SQL expression), in timeLayout. SQLite keeps
// times as whole milliseconds internally, so the sum is exact.
func sqlAddMS(t, ms string) string {
	return "strftime('%Y-%m-%dT%H:%M:%fZ', " + t + ", format('%+.3f seconds', (" + ms + ") / 1000.0))"
}

// timeParser parses the time columns of one row, keeping the first error so
// a row conversion can parse every column and check once.
type timeParser struct {
	err error
}

// time parses a NOT NULL time column.
func (tp *timeParser) time(s string) time.Time {
	t, err := parseTime(s)
	if err != nil && tp.err == nil {
		tp.err = err
	}
	return t
}

// nullTime parses a nullable time column; NULL is nil.
func (tp *timeParser) nullTime(s sql.Null[string]) *time.Time {
	if !s.Valid {
		return nil
	}
	t := tp.time(s.V)
	return &t
}
