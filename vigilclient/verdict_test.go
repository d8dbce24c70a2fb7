package vigilclient

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The activity-only cutover verdict (DESIGN T6, issue #14): safe only when
// some host sent heartbeats and none sent v1 in the window.
func TestCutoverVerdict(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	row := func(host string, version int) HostHeartbeatVersion {
		return HostHeartbeatVersion{Hostname: host, SchemaVersion: version, LastSentAt: at, Heartbeats: 3}
	}
	for _, tc := range []struct {
		name    string
		hosts   []HostHeartbeatVersion
		safe    bool
		v1      []string
		message string
	}{
		{"none", nil, false, []string{}, "no lease heartbeats in the last 24h0m0s: nothing to judge the cutover by"},
		{"all v2", []HostHeartbeatVersion{row("a", 2), row("b", 2)}, true, []string{},
			"all 2 hosts sent v2 only in the last 24h0m0s: safe to cut over (--lease-expiry activity-only)"},
		{"a host sends both", []HostHeartbeatVersion{row("b", 2), row("b", 1), row("a", 2), row("c", 1)}, false, []string{"b", "c"},
			"2 of 3 hosts still send v1 (b, c) in the last 24h0m0s: not safe to cut over"},
	} {
		v := HeartbeatVersions{WindowS: 86400, Hosts: tc.hosts}
		got := v.Verdict()
		require.Equal(t, tc.safe, got.Safe, tc.name)
		require.Equal(t, tc.v1, got.V1Hosts, tc.name)
		require.Equal(t, tc.message, got.Message, tc.name)
	}
}
