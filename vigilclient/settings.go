package vigilclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// Per-process defaults (DESIGN L5, §9). Each knob is independent: never
// derive one from another (DESIGN §1).
const (
	// LivenessIntervalDefault is how often an agent sends its liveness
	// heartbeat, whatever it is doing (DESIGN L5: 30s). The server shows the
	// instance stopped after 3× this without one (DESIGN L3).
	LivenessIntervalDefault = 30 * time.Second
	// HeartbeatIntervalDefault is how often an agent renews the lease of the
	// task it holds (DESIGN L5: 60s), comfortably inside the server's
	// default 5 min lease window (DESIGN T3).
	HeartbeatIntervalDefault = 60 * time.Second
	// PollIntervalDefault is how long an idle agent waits between claims
	// (DESIGN L5: 5s).
	PollIntervalDefault = 5 * time.Second
)

// Environment variables read by SettingsFromEnv and NewFromEnv.
const (
	// EnvLivenessSuffix, EnvHeartbeatSuffix and EnvPollSuffix complete
	// "VIGIL_<KIND>_" (see EnvPrefix) into the per-process settings (DESIGN L5).
	EnvLivenessSuffix  = "LIVENESS_INTERVAL"
	EnvHeartbeatSuffix = "HEARTBEAT_INTERVAL"
	EnvPollSuffix      = "POLL_INTERVAL"
	// EnvURL is a comma-separated list of server URLs, tried in turn
	// (default URLDefault).
	EnvURL = "VIGIL_URL"
	// EnvTokenFile names a file holding the server token (optional); it is
	// sent as "Authorization: Bearer <token>". The file holds one token a
	// line, blank lines and # comments skipped; the first is sent (a token
	// file of the server's, where the newest token goes first).
	EnvTokenFile = "VIGIL_TOKEN_FILE"
	// EnvCAFile names a PEM file of the CA certificates to trust for an
	// https:// server (optional; see LoadCAFile): the system's roots are
	// then not used.
	EnvCAFile = "VIGIL_CA_FILE"
)

// URLDefault is where `vigil serve` listens by default (docs/api.md).
const URLDefault = "http://127.0.0.1:7711"

// intervalRule is the rule every interval setting must follow, as users see it.
const intervalRule = "must be a positive duration like 30s"

// Settings are one process's three independent intervals (DESIGN L5). A zero
// field takes its default when an Agent runs.
type Settings struct {
	// LivenessInterval: between liveness heartbeats (LivenessIntervalDefault).
	LivenessInterval time.Duration
	// HeartbeatInterval: between lease heartbeats while a task is held
	// (HeartbeatIntervalDefault).
	HeartbeatInterval time.Duration
	// PollInterval: between claims while idle (PollIntervalDefault).
	PollInterval time.Duration
}

// withDefaults fills zero fields with the defaults.
func (s Settings) withDefaults() Settings {
	if s.LivenessInterval == 0 {
		s.LivenessInterval = LivenessIntervalDefault
	}
	if s.HeartbeatInterval == 0 {
		s.HeartbeatInterval = HeartbeatIntervalDefault
	}
	if s.PollInterval == 0 {
		s.PollInterval = PollIntervalDefault
	}
	return s
}

// validate reports negative intervals, naming the field.
func (s Settings) validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"LivenessInterval", s.LivenessInterval},
		{"HeartbeatInterval", s.HeartbeatInterval},
		{"PollInterval", s.PollInterval},
	} {
		if f.d <= 0 {
			errs = append(errs, vigiltype.Invalid("Settings."+f.name, fmt.Sprintf("%s, got %s", intervalRule, f.d)))
		}
	}
	return errors.Join(errs...)
}

// EnvPrefix returns "VIGIL_<KIND>_" for kind: upper-cased, with '-' and '.'
// turned into '_' (DESIGN L5). EnvPrefix("fork-resolution") is
// "VIGIL_FORK_RESOLUTION_".
func EnvPrefix(kind string) string {
	k := strings.NewReplacer("-", "_", ".", "_").Replace(strings.ToUpper(kind))
	return "VIGIL_" + k + "_"
}

// SettingsFromEnv reads kind's settings from VIGIL_<KIND>_LIVENESS_INTERVAL,
// VIGIL_<KIND>_HEARTBEAT_INTERVAL and VIGIL_<KIND>_POLL_INTERVAL (DESIGN L5).
// An unset or empty variable takes its default. Values are Go durations
// ("30s", "1m30s") or plain numbers of seconds ("30", "0.5"). A value that
// is not positive, is NaN or infinite, or does not parse is an error naming
// the variable and the rule, e.g.
//
//	VIGIL_WORKER_LIVENESS_INTERVAL="-1": must be a positive duration like 30s
//
// Every bad variable is reported (errors.Join); each is an *EnvError, which
// matches vigiltype.ErrInvalid with errors.Is.
func SettingsFromEnv(kind string) (Settings, error) {
	return settingsFromLookup(kind, os.LookupEnv)
}

func settingsFromLookup(kind string, lookup func(string) (string, bool)) (Settings, error) {
	if kind == "" {
		return Settings{}, vigiltype.Invalid("kind", "required to name the VIGIL_<KIND>_* settings")
	}
	prefix := EnvPrefix(kind)
	var errs []error
	read := func(suffix string, def time.Duration) time.Duration {
		name := prefix + suffix
		raw, ok := lookup(name)
		if !ok || strings.TrimSpace(raw) == "" {
			return def
		}
		d, err := ParseInterval(raw)
		if err != nil {
			errs = append(errs, &EnvError{Var: name, Value: raw, Rule: intervalRule})
			return def
		}
		return d
	}
	s := Settings{
		LivenessInterval:  read(EnvLivenessSuffix, LivenessIntervalDefault),
		HeartbeatInterval: read(EnvHeartbeatSuffix, HeartbeatIntervalDefault),
		PollInterval:      read(EnvPollSuffix, PollIntervalDefault),
	}
	if err := errors.Join(errs...); err != nil {
		return Settings{}, err
	}
	return s, nil
}

// EnvError is a bad value in an environment variable. It matches
// vigiltype.ErrInvalid with errors.Is.
type EnvError struct {
	Var   string // the variable, e.g. VIGIL_WORKER_POLL_INTERVAL
	Value string // its value as set
	Rule  string // the rule it breaks
}

func (e *EnvError) Error() string { return fmt.Sprintf("%s=%q: %s", e.Var, e.Value, e.Rule) }

// Is makes errors.Is(err, vigiltype.ErrInvalid) true.
func (e *EnvError) Is(target error) bool { return target == vigiltype.ErrInvalid }

// ParseInterval parses an interval setting: a Go duration ("30s", "1m30s",
// "500ms") or a plain number of seconds ("30", "0.5"). The result must be
// positive and finite; otherwise the error says "must be a positive
// duration like 30s".
func ParseInterval(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var d time.Duration
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		ns := f * float64(time.Second)
		if math.IsNaN(f) || math.IsInf(f, 0) || ns <= 0 || ns >= math.MaxInt64 {
			return 0, fmt.Errorf("%q: %s", s, intervalRule)
		}
		d = time.Duration(ns)
	} else if d, err = time.ParseDuration(s); err != nil {
		return 0, fmt.Errorf("%q: %s", s, intervalRule)
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q: %s", s, intervalRule)
	}
	return d, nil
}

// NewFromEnv returns a Client for the servers listed in VIGIL_URL
// (comma-separated, default URLDefault), sending the server token read from
// the file named by VIGIL_TOKEN_FILE when that is set, and trusting the CA
// certificates in the file named by VIGIL_CA_FILE when that is set (see
// LoadCAFile). opts are applied after the environment's, so they win.
func NewFromEnv(opts ...Option) (*Client, error) {
	urls, token, err := connFromLookup(os.LookupEnv, os.ReadFile)
	if err != nil {
		return nil, err
	}
	if token != "" {
		opts = append([]Option{WithToken(token)}, opts...)
	}
	tc, err := tlsFromLookup(os.LookupEnv)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append([]Option{WithTLSConfig(tc)}, opts...)
	}
	return New(urls, opts...)
}

// tlsFromLookup reads VIGIL_CA_FILE: nil when it is unset or empty.
func tlsFromLookup(lookup func(string) (string, bool)) (*tls.Config, error) {
	path, ok := lookup(EnvCAFile)
	if !ok || strings.TrimSpace(path) == "" {
		return nil, nil
	}
	tc, err := LoadCAFile(strings.TrimSpace(path))
	if err != nil {
		return nil, fmt.Errorf("%s=%q: %w", EnvCAFile, path, err)
	}
	return tc, nil
}

func connFromLookup(lookup func(string) (string, bool), readFile func(string) ([]byte, error)) (urls []string, token string, err error) {
	raw, _ := lookup(EnvURL)
	for u := range strings.SplitSeq(raw, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	if len(urls) == 0 {
		urls = []string{URLDefault}
	}
	if path, ok := lookup(EnvTokenFile); ok && strings.TrimSpace(path) != "" {
		b, err := readFile(strings.TrimSpace(path))
		if err != nil {
			return nil, "", fmt.Errorf("%s=%q: read the server token: %w", EnvTokenFile, path, err)
		}
		if token = firstToken(string(b)); token == "" {
			return nil, "", &EnvError{Var: EnvTokenFile, Value: path, Rule: "the file must hold the server token"}
		}
	}
	return urls, token, nil
}

// firstToken is the first token of a token file's text: its first line
// that is neither blank nor a # comment, trimmed; "" when there is none.
func firstToken(text string) string {
	for line := range strings.Lines(text) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			return line
		}
	}
	return ""
}
