package pgstore

import (
	"cmp"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// redactMask replaces a password in text.
const redactMask = "xxxxx"

// Redact returns connString with its passwords masked, for logs and error
// messages: the userinfo password and the password / sslpassword query
// parameters of a URL, password=... of a keyword/value string. A string it
// cannot parse is reduced to its scheme ("postgres://…"), since where its
// password ends cannot be known.
func Redact(connString string) string {
	if !strings.Contains(connString, "://") {
		return scrub(connString, connString)
	}
	u, err := url.Parse(connString)
	if err != nil || u.Opaque != "" {
		scheme, _, _ := strings.Cut(connString, "://")
		if strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql") {
			return scheme + "://…"
		}
		return "…"
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), redactMask)
	}
	q, masked := u.Query(), false
	for key := range q {
		if isPasswordKey(key) {
			q.Set(key, redactMask)
			masked = true
		}
	}
	if masked {
		u.RawQuery = q.Encode()
	}
	return scrub(connString, u.String())
}

// isPasswordKey reports whether a connection parameter holds a secret.
func isPasswordKey(key string) bool {
	key = strings.ToLower(key)
	return key == "password" || key == "sslpassword"
}

// scrub masks in text every secret connString carries (see secrets).
func scrub(connString, text string) string {
	for _, s := range secrets(connString) {
		text = strings.ReplaceAll(text, s, redactMask)
	}
	return text
}

// keywordPassword matches password=... and sslpassword=... in a keyword/value
// connection string, quoted or not.
var keywordPassword = regexp.MustCompile(`(?i)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// secrets returns the strings that may be a password in connString, longest
// first, in every spelling an error text might quote: as written and
// percent-decoded, and, for a malformed URL whose password contains a URL
// delimiter, also the delimiter-separated fragments of each one, so that a
// parser that split the password cannot quote a piece of it. Over-masking is
// the price of never printing a password.
func secrets(connString string) []string {
	var found []string
	add := func(s string) {
		if s == "" || s == redactMask {
			return
		}
		found = append(found, s)
		if dec, err := url.PathUnescape(s); err == nil && dec != s {
			found = append(found, dec)
		}
		if dec, err := url.QueryUnescape(s); err == nil && dec != s {
			found = append(found, dec)
		}
	}

	u, err := url.Parse(connString)
	if err == nil {
		if pw, ok := u.User.Password(); ok {
			add(pw)
		}
		for key, values := range u.Query() {
			if isPasswordKey(key) {
				for _, v := range values {
					add(v)
				}
			}
		}
	}
	if !strings.Contains(connString, "://") {
		for _, m := range keywordPassword.FindAllStringSubmatch(connString, -1) {
			add(m[1])
			add(strings.Trim(m[1], "'"))
		}
	}
	// A URL that does not parse: guess the userinfo password as what lies
	// between "://" and the last '@', after the first ':'.
	if _, rest, ok := strings.Cut(connString, "://"); ok && err != nil {
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				add(pw)
				for _, piece := range strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune(":/?#@[]", r) }) {
					add(piece)
				}
			}
		}
	}

	// Longest first, so a password is masked whole before its fragments.
	slices.SortFunc(found, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return slices.Compact(found)
}

// redactedError carries a message with the connection string's secrets
// masked, and unwraps to the original error so callers can still test it
// with errors.Is (context deadlines, pgconn.Timeout).
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redactError returns err with connString's secrets masked from its text.
func redactError(connString string, err error) error {
	return &redactedError{msg: scrub(connString, err.Error()), err: err}
}
