package vigiltype

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// The text rule (docs/api.md, "Text"): every string vigil stores is valid
// UTF-8 without control characters (C0, DEL and C1: NUL, which PostgreSQL
// text cannot hold, and the escape sequences that would reach an
// operator's terminal through `vigil events`). The server refuses text
// breaking it with a 400 naming the field, before the store, so every
// backend answers alike. Two fields carry a program's captured output — an
// event's stderr_tail and a failed task's error — and are cleaned instead
// (CleanText): they keep newlines and tabs, and refusing them would lose
// the event or the failure.

// TextRule is the rule CheckText's FieldError says was broken.
const TextRule = "must be UTF-8 text without control characters"

// CheckText applies the text rule to a field.
func CheckText(field, s string) error {
	if !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return Invalid(field, TextRule)
	}
	return nil
}

// CleanText makes captured output storable and safe to print: CRLF and a
// lone CR become a newline; invalid UTF-8 and every control character but
// newline and tab become U+FFFD.
func CleanText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.IndexFunc(s, lineControl) < 0 {
		return s
	}
	s = strings.ReplaceAll(s, "\r\n", "\n")
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\r':
			return '\n'
		case lineControl(r):
			return '\uFFFD'
		}
		return r
	}, s)
}

func lineControl(r rune) bool { return r != '\n' && r != '\t' && unicode.IsControl(r) }
