package vigilclient

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestAPIErrorIs(t *testing.T) {
	t.Parallel()

	for code, sentinel := range map[string]error{
		"stale_epoch":      vigiltype.ErrStaleEpoch,
		"not_found":        vigiltype.ErrNotFound,
		"invalid":          vigiltype.ErrInvalid,
		"malformed_json":   vigiltype.ErrInvalid,
		"invalid_token":    vigiltype.ErrInvalidToken,
		"instance_exited":  vigiltype.ErrInstanceExited,
		"instance_stopped": vigiltype.ErrInstanceStopped,
		"unauthorized":     vigiltype.ErrUnauthorized,
		"outcome_conflict": vigiltype.ErrOutcomeConflict,
		"unavailable":      vigiltype.ErrUnavailable,
	} {
		err := fmt.Errorf("complete task 7: %w", &APIError{Status: 409, Code: code, Message: "m"})
		require.ErrorIs(t, err, sentinel, code)
		for _, other := range []error{vigiltype.ErrStaleEpoch, vigiltype.ErrNotFound, vigiltype.ErrInvalid,
			vigiltype.ErrInvalidToken, vigiltype.ErrInstanceExited, vigiltype.ErrUnauthorized} {
			if other != sentinel {
				require.NotErrorIs(t, err, other, code)
			}
		}
	}
	require.NotErrorIs(t, &APIError{Status: 500, Code: "internal"}, vigiltype.ErrNotFound)
}

func TestDecodeAPIError(t *testing.T) {
	t.Parallel()

	e := decodeAPIError(409, []byte(`{"error":{"code":"stale_epoch","message":"task 7: stale lease epoch"}}`))
	require.Equal(t, &APIError{Status: 409, Code: "stale_epoch", Message: "task 7: stale lease epoch"}, e)
	require.Equal(t, "task 7: stale lease epoch (HTTP 409 stale_epoch)", e.Error())

	e = decodeAPIError(502, []byte("<html>bad gateway</html>"))
	require.Equal(t, &APIError{Status: 502, Message: "<html>bad gateway</html>"}, e)
	require.Equal(t, "<html>bad gateway</html> (HTTP 502 bad_gateway)", e.Error())

	e = decodeAPIError(503, nil)
	require.Equal(t, "Service Unavailable", e.Message)
}

func TestIsTransient(t *testing.T) {
	t.Parallel()

	require.False(t, isTransient(nil))
	require.True(t, isTransient(errors.New("connection refused")))
	require.True(t, isTransient(fmt.Errorf("x: %w", &APIError{Status: 503})))
	require.False(t, isTransient(fmt.Errorf("x: %w", &APIError{Status: 409, Code: "stale_epoch"})))
	require.False(t, isTransient(fmt.Errorf("x: %w", &APIError{Status: 409, Code: "outcome_conflict"})))
	require.True(t, isTransient(fmt.Errorf("x: %w", &APIError{Status: 503, Code: "unavailable"})), "a store outage is retried")
	require.False(t, isTransient(&APIError{Status: 401, Code: "unauthorized"}))
}

func TestNewValidatesURLs(t *testing.T) {
	t.Parallel()

	_, err := New(nil)
	require.Error(t, err)
	for _, bad := range []string{"127.0.0.1:7711", "ftp://x", "http://", "::"} {
		_, err := New([]string{bad})
		require.Error(t, err, bad)
	}
	c, err := New([]string{"http://a:1/", "https://b/vigil/"})
	require.NoError(t, err)
	require.Equal(t, []string{"http://a:1", "https://b/vigil"}, c.URLs())
}
