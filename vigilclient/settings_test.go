package vigilclient

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestEnvPrefix(t *testing.T) {
	t.Parallel()

	require.Equal(t, "VIGIL_WORKER_", EnvPrefix("worker"))
	require.Equal(t, "VIGIL_FORK_RESOLUTION_", EnvPrefix("fork-resolution"))
	require.Equal(t, "VIGIL_CRITIC_V2_", EnvPrefix("critic.v2"))
}

func TestParseInterval(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"30s", 30 * time.Second},
		{"1m30s", 90 * time.Second},
		{"500ms", 500 * time.Millisecond},
		{"30", 30 * time.Second},
		{"0.5", 500 * time.Millisecond},
		{" 2 ", 2 * time.Second},
		{"1e1", 10 * time.Second},
	} {
		got, err := ParseInterval(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	for _, bad := range []string{"-1", "0", "0s", "-5s", "abc", "NaN", "nan", "Inf", "+Inf", "-Inf", "infinity", "1e300", "", "30 s", "1e-12"} {
		_, err := ParseInterval(bad)
		require.Error(t, err, "%q", bad)
		require.Contains(t, err.Error(), "must be a positive duration like 30s", bad)
	}
}

func mapLookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestSettingsFromLookupDefaults(t *testing.T) {
	t.Parallel()

	s, err := settingsFromLookup("worker", mapLookup(nil))
	require.NoError(t, err)
	require.Equal(t, Settings{LivenessInterval: 30 * time.Second, HeartbeatInterval: 60 * time.Second, PollInterval: 5 * time.Second}, s)

	s, err = settingsFromLookup("worker", mapLookup(map[string]string{"VIGIL_WORKER_POLL_INTERVAL": "  "}))
	require.NoError(t, err)
	require.Equal(t, PollIntervalDefault, s.PollInterval, "empty means unset")
}

func TestSettingsFromLookupIndependent(t *testing.T) {
	t.Parallel()

	s, err := settingsFromLookup("fork-resolution", mapLookup(map[string]string{
		"VIGIL_FORK_RESOLUTION_LIVENESS_INTERVAL":  "10",
		"VIGIL_FORK_RESOLUTION_HEARTBEAT_INTERVAL": "1m",
		"VIGIL_WORKER_POLL_INTERVAL":               "1s", // another kind's: ignored
	}))
	require.NoError(t, err)
	require.Equal(t, Settings{LivenessInterval: 10 * time.Second, HeartbeatInterval: time.Minute, PollInterval: PollIntervalDefault}, s)
}

func TestSettingsFromLookupBad(t *testing.T) {
	t.Parallel()

	for _, bad := range []string{"-1", "0", "abc", "NaN", "Inf", "-3s"} {
		for _, suffix := range []string{EnvLivenessSuffix, EnvHeartbeatSuffix, EnvPollSuffix} {
			name := "VIGIL_WORKER_" + suffix
			t.Run(name+"="+bad, func(t *testing.T) {
				t.Parallel()
				_, err := settingsFromLookup("worker", mapLookup(map[string]string{name: bad}))
				require.Error(t, err)
				require.EqualError(t, err, name+"=\""+bad+"\": must be a positive duration like 30s")
				require.ErrorIs(t, err, vigiltype.ErrInvalid)
				var envErr *EnvError
				require.ErrorAs(t, err, &envErr)
				require.Equal(t, name, envErr.Var)
				require.Equal(t, bad, envErr.Value)
			})
		}
	}
}

func TestSettingsFromLookupReportsEveryBadVariable(t *testing.T) {
	t.Parallel()

	_, err := settingsFromLookup("worker", mapLookup(map[string]string{
		"VIGIL_WORKER_LIVENESS_INTERVAL": "-1",
		"VIGIL_WORKER_POLL_INTERVAL":     "soon",
	}))
	require.Error(t, err)
	require.Contains(t, err.Error(), `VIGIL_WORKER_LIVENESS_INTERVAL="-1": must be a positive duration like 30s`)
	require.Contains(t, err.Error(), `VIGIL_WORKER_POLL_INTERVAL="soon": must be a positive duration like 30s`)
	require.NotContains(t, err.Error(), "HEARTBEAT")
}

func TestSettingsFromLookupNeedsKind(t *testing.T) {
	t.Parallel()

	_, err := settingsFromLookup("", mapLookup(nil))
	require.ErrorIs(t, err, vigiltype.ErrInvalid)
}

// SettingsFromEnv itself reads the process environment.
func TestSettingsFromEnv(t *testing.T) {
	t.Setenv("VIGIL_ENV_TEST_KIND_LIVENESS_INTERVAL", "0.25")
	t.Setenv("VIGIL_ENV_TEST_KIND_HEARTBEAT_INTERVAL", "NaN")
	_, err := SettingsFromEnv("env-test.kind")
	require.EqualError(t, err, `VIGIL_ENV_TEST_KIND_HEARTBEAT_INTERVAL="NaN": must be a positive duration like 30s`)

	t.Setenv("VIGIL_ENV_TEST_KIND_HEARTBEAT_INTERVAL", "2s")
	s, err := SettingsFromEnv("env-test.kind")
	require.NoError(t, err)
	require.Equal(t, Settings{LivenessInterval: 250 * time.Millisecond, HeartbeatInterval: 2 * time.Second, PollInterval: PollIntervalDefault}, s)
}

func TestSettingsValidate(t *testing.T) {
	t.Parallel()

	require.NoError(t, Settings{}.withDefaults().validate())
	err := Settings{LivenessInterval: -time.Second}.withDefaults().validate()
	require.ErrorIs(t, err, vigiltype.ErrInvalid)
	require.Contains(t, err.Error(), "Settings.LivenessInterval")
}

func TestConnFromLookup(t *testing.T) {
	t.Parallel()

	noFile := func(string) ([]byte, error) { return nil, os.ErrNotExist }

	urls, token, err := connFromLookup(mapLookup(nil), noFile)
	require.NoError(t, err)
	require.Equal(t, []string{URLDefault}, urls)
	require.Empty(t, token)

	urls, _, err = connFromLookup(mapLookup(map[string]string{EnvURL: " http://a:1 , ,http://b:2"}), noFile)
	require.NoError(t, err)
	require.Equal(t, []string{"http://a:1", "http://b:2"}, urls)

	_, token, err = connFromLookup(mapLookup(map[string]string{EnvTokenFile: "/etc/vigil/token"}), func(p string) ([]byte, error) {
		require.Equal(t, "/etc/vigil/token", p)
		return []byte("s3cret\n"), nil
	})
	require.NoError(t, err)
	require.Equal(t, "s3cret", token)

	// A server's token file with several tokens (a rotation): the first.
	_, token, err = connFromLookup(mapLookup(map[string]string{EnvTokenFile: "/etc/vigil/agent"}), func(string) ([]byte, error) {
		return []byte("# rotated 2026-12-01\n\n  new-token-0123456789  \nold-token-0123456789\n"), nil
	})
	require.NoError(t, err)
	require.Equal(t, "new-token-0123456789", token)

	_, _, err = connFromLookup(mapLookup(map[string]string{EnvTokenFile: "/nope"}), noFile)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Contains(t, err.Error(), "VIGIL_TOKEN_FILE")

	_, _, err = connFromLookup(mapLookup(map[string]string{EnvTokenFile: "/empty"}), func(string) ([]byte, error) { return []byte(" \n# only a comment\n"), nil })
	require.ErrorIs(t, err, vigiltype.ErrInvalid)
	require.Contains(t, err.Error(), "VIGIL_TOKEN_FILE")
}
