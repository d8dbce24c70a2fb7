package pgstore

import "time"

// timeLayout is the text form a time takes inside messages and reasons
// (last_error): UTC, fixed width, millisecond precision — the layout
// sqlitestore stores times in, so both backends write the same reasons.
const timeLayout = "2006-01-02T15:04:05.000Z"

// sqlTimeText is the SQL expression formatting the timestamptz expression t
// in timeLayout, whatever the session's TimeZone.
func sqlTimeText(t string) string {
	return `to_char((` + t + `) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`
}

// sqlAddMS is the SQL expression for the timestamptz expression t plus ms
// milliseconds (an integer SQL expression). Whole milliseconds times an
// interval of one millisecond is exact.
func sqlAddMS(t, ms string) string {
	return `((` + t + `)::timestamptz + (` + ms + `) * interval '1 millisecond')`
}

// utcMS is t in UTC truncated to the millisecond, the precision the store
// keeps. Every time passes through it before it is compared or written.
func utcMS(t time.Time) time.Time {
	return t.UTC().Truncate(time.Millisecond)
}

// utcMSPtr is utcMS for an optional time.
func utcMSPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := utcMS(*t)
	return &u
}

// utcPtr converts a time read from the database to UTC; nil stays nil.
func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
