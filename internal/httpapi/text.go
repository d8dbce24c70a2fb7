package httpapi

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// cleanedFields are the top-level body fields that carry a program's
// captured output — a failed task's error, an event's stderr_tail. Invalid
// UTF-8 in them is replaced with U+FFFD, as the services replace their
// control characters (vigiltype.CleanText), rather than refused: refusing
// would lose the failure or the exit event.
var cleanedFields = map[string]bool{"error": true, "stderr_tail": true}

// invalidUTF8Field names the first field of JSON body whose text is not
// valid UTF-8 ("hostname", "config.launch.host", "payload.list[1]"), ""
// when there is none but in cleanedFields. A bad key is named by the object
// holding it; JSON too broken to walk is "request body".
func invalidUTF8Field(body []byte) string {
	type frame struct {
		object  bool
		key     string // object: the current member's key
		index   int    // array: the current element's index
		wantKey bool   // object: the next token is a key
	}
	var stack []*frame
	path := func() string {
		var b strings.Builder
		for _, f := range stack {
			if f.object {
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(f.key)
			} else {
				b.WriteString("[" + strconv.Itoa(f.index) + "]")
			}
		}
		return cmp.Or(b.String(), "request body")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var prev int64
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return ""
		}
		if err != nil {
			return "request body"
		}
		end := dec.InputOffset()
		bad := !utf8.Valid(body[prev:end]) // the token and the separators before it
		prev = end
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].wantKey = true
			}
			continue
		}
		if top != nil && top.object && top.wantKey {
			if bad {
				stack = stack[:len(stack)-1]
				return path()
			}
			top.key, top.wantKey = tok.(string), false
			continue
		}
		if top != nil && !top.object {
			top.index++
		}
		if p := path(); bad && !cleanedFields[p] {
			return p
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{index: -1})
		default:
			if top != nil && top.object {
				top.wantKey = true
			}
		}
	}
}
