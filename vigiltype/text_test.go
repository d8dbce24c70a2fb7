package vigiltype_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestCheckText(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"", "SIGKILL", "café — 東京", "a b"} {
		if err := vigiltype.CheckText("f", ok); err != nil {
			t.Errorf("CheckText(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"a\x00b", "\x1b[2J", "a\nb", "a\tb", "a\rb", "\x7f", "\u009b", "\xff", "h\xc3\x28"} {
		err := vigiltype.CheckText("f", bad)
		if !errors.Is(err, vigiltype.ErrInvalid) || err.Error() != "f: "+vigiltype.TextRule {
			t.Errorf("CheckText(%q) = %v, want the field error", bad, err)
		}
	}
}

func TestCleanText(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain\n\tindented\n":      "plain\n\tindented\n",
		"crlf\r\nline\rover":       "crlf\nline\nover",
		"\x1b[31mred\x1b[0m":       "\uFFFD[31mred\uFFFD[0m",
		"nul\x00 del\x7f c1\u0085": "nul\uFFFD del\uFFFD c1\uFFFD",
		"bad \xff utf8":            "bad \uFFFD utf8",
	} {
		got := vigiltype.CleanText(in)
		if got != want {
			t.Errorf("CleanText(%q) = %q, want %q", in, got, want)
		}
		if err := vigiltype.CheckText("f", strings.NewReplacer("\n", "", "\t", "").Replace(got)); err != nil {
			t.Errorf("CleanText(%q) = %q keeps a control character", in, got)
		}
	}
}
