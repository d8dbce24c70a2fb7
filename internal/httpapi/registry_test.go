package httpapi_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

func (b *testBundle) agent(name string) vigiltype.Agent {
	b.t.Helper()
	r := b.do("GET", "/v1/agents/"+name, "")
	require.Equal(b.t, http.StatusOK, r.status, "%s", r.body)
	var a vigiltype.Agent
	r.decode(b.t, &a)
	return a
}

// DESIGN R1: register replaces; list is oldest first with stopped ones;
// update is partial and compare-and-swap.
func TestAgentRegistry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do("POST", "/v1/agents", `{"name":"research","function":"research assistant","tick_cron":"0 * * * *","config":{"model":"m1"}}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	b.clock.Advance(time.Second)
	r = b.do("POST", "/v1/agents", `{"name":"critic","tick_cron":"@every 10m"}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)

	r = b.do("POST", "/v1/agents/research/mark-stopped", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	stopped := b.agent("research")
	require.Equal(t, vigiltype.AgentStopped, stopped.Status)
	require.True(t, stopped.StoppedAt.Equal(b.clock.Now()))

	r = b.do("GET", "/v1/agents", "")
	var list struct {
		Agents []vigiltype.Agent `json:"agents"`
	}
	r.decode(t, &list)
	require.Len(t, list.Agents, 2)
	require.Equal(t, "research", list.Agents[0].Name, "oldest first, stopped included")
	require.Equal(t, "critic", list.Agents[1].Name)

	// Two operators read the same version; the first update wins, the
	// second is refused and writes nothing.
	v := b.agent("critic").Version
	r = b.do("PATCH", "/v1/agents/critic", `{"version":`+itoa(v)+`,"function":"reviews drafts"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	r = b.do("PATCH", "/v1/agents/critic", `{"version":`+itoa(v)+`,"tick_cron":"@hourly"}`)
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	code, msg := r.errorCode(t)
	require.Equal(t, "conflict", code)
	require.Contains(t, msg, `agent "critic"`)
	critic := b.agent("critic")
	require.Equal(t, "reviews drafts", critic.Function)
	require.Equal(t, "@every 10m", critic.TickCron, "the losing update changed nothing")

	// Register again: an unconditional replace that resets status and config.
	b.clock.Advance(time.Minute)
	r = b.do("POST", "/v1/agents", `{"name":"research","function":"v2"}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	replaced := b.agent("research")
	require.Equal(t, vigiltype.AgentActive, replaced.Status)
	require.Nil(t, replaced.StoppedAt)
	require.JSONEq(t, `null`, string(replaced.Config))
	require.True(t, replaced.CreatedAt.Equal(b.clock.Now()), "created_at reset")
	require.Greater(t, replaced.Version, stopped.Version)
}

func TestAgentRegistryBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.do("POST", "/v1/agents", `{"name":"ok"}`).status)
	v := itoa(b.agent("ok").Version)
	cases := []struct {
		name, method, path, body string
		status                   int
		msg                      string
	}{
		{"bad name", "POST", "/v1/agents", `{"name":"a b"}`, 400, "name: may only contain"},
		{"bad cron", "POST", "/v1/agents", `{"name":"x","tick_cron":"every tuesday"}`, 400, "tick_cron: \"every tuesday\" is not a cron spec"},
		{"cron every negative", "POST", "/v1/agents", `{"name":"x","tick_cron":"@every -5m"}`, 400, "@every needs a duration of at least 1s"},
		{"cron every zero", "POST", "/v1/agents", `{"name":"x","tick_cron":"@every 0s"}`, 400, "@every needs a duration of at least 1s"},
		{"function control chars", "POST", "/v1/agents", `{"name":"x","function":"a\u0000b"}`, 400, "function: must be UTF-8 text without control characters"},
		{"launch without host", "POST", "/v1/agents", `{"name":"x","config":{"launch":{"command":["sleep","1"]}}}`, 400, "config.launch.host: is required"},
		{"launch empty command", "POST", "/v1/agents", `{"name":"x","config":{"launch":{"host":"h","command":[]}}}`, 400, "config.launch.command: must be a non-empty argv list"},
		{"launch command string", "POST", "/v1/agents", `{"name":"x","config":{"launch":{"host":"h","command":"sleep 5"}}}`, 400, "config.launch: must be"},
		{"launch relative dir", "POST", "/v1/agents", `{"name":"x","config":{"launch":{"host":"h","command":["a"],"dir":"rel"}}}`, 400, "config.launch.dir: must be an absolute path"},
		{"config too deep", "POST", "/v1/agents", `{"name":"x","config":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`, 400, "config: must not nest"},
		{"cron six fields", "POST", "/v1/agents", `{"name":"x","tick_cron":"0 0 * * * *"}`, 400, "tick_cron"},
		{"config not JSON", "POST", "/v1/agents", `{"name":"x","config":nope}`, 400, ""},
		{"update without version", "PATCH", "/v1/agents/ok", `{"function":"f"}`, 400, "version: is required"},
		{"update nothing", "PATCH", "/v1/agents/ok", `{"version":` + v + `}`, 400, "nothing to update"},
		{"update bad cron", "PATCH", "/v1/agents/ok", `{"version":` + v + `,"tick_cron":"61 * * * *"}`, 400, "tick_cron"},
		{"update missing", "PATCH", "/v1/agents/ghost", `{"version":1,"function":"f"}`, 404, `agent "ghost"`},
		{"get missing", "GET", "/v1/agents/ghost", "", 404, ""},
		{"mark missing", "POST", "/v1/agents/ghost/mark-stopped", "", 404, ""},
	}
	for _, c := range cases {
		r := b.do(c.method, c.path, c.body)
		require.Equal(t, c.status, r.status, "%s: %s", c.name, r.body)
		_, msg := r.errorCode(t)
		require.Contains(t, msg, c.msg, c.name)
	}
	r := b.do("GET", "/v1/agents", "")
	require.Contains(t, string(r.body), `"name":"ok"`)
	require.NotContains(t, string(r.body), `"name":"x"`, "a refused register wrote a record")
}

type eventPage struct {
	Events     []vigiltype.ProcessEvent `json:"events"`
	NextCursor *string                  `json:"next_cursor"`
}

func (b *testBundle) events(query string) eventPage {
	b.t.Helper()
	r := b.do("GET", "/v1/events"+query, "")
	require.Equal(b.t, http.StatusOK, r.status, "%s", r.body)
	var p eventPage
	r.decode(b.t, &p)
	return p
}

func (b *testBundle) recordExit(agent string) vigiltype.ProcessEvent {
	b.t.Helper()
	r := b.do("POST", "/v1/events", `{"agent":"`+agent+`","kind":"exit","exit_code":3,"run_duration_ms":1500,"stderr_tail":"boom\n"}`)
	require.Equal(b.t, http.StatusCreated, r.status, "%s", r.body)
	var e vigiltype.ProcessEvent
	r.decode(b.t, &e)
	return e
}

// DESIGN E1, E2: events are durable, newest first; a planned stop makes the
// exits it covers suppressed (delivered at once) for its whole TTL, for that
// agent only; a consumer acknowledges what it delivered.
func TestProcessEventsAndPlannedStops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.registerAgent("research") // a planned stop is for a registered agent
	crash := b.recordExit("research")
	require.Nil(t, crash.DeliveredAt, "a crash is undelivered")
	require.True(t, crash.At.Equal(b.clock.Now()), "stamped by the server's clock")

	r := b.do("POST", "/v1/agents/research/planned-stop", `{"reason":"operator redeploy"}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	var marker vigiltype.PlannedStop
	r.decode(t, &marker)
	require.Equal(t, 120*time.Second, marker.ExpiresAt.Sub(marker.CreatedAt), "default TTL")

	b.clock.Advance(10 * time.Second)
	r = b.do("GET", "/v1/agents/research/planned-stop", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var read vigiltype.PlannedStop
	r.decode(t, &read)
	require.Equal(t, int64(10_000), read.AgeMS, "its age on the server's clock, for a reader on another clock (DESIGN L10)")
	require.True(t, read.CreatedAt.Equal(marker.CreatedAt))
	first := b.recordExit("research")
	b.clock.Advance(100 * time.Second)
	second := b.recordExit("research")
	other := b.recordExit("critic")
	for _, e := range []vigiltype.ProcessEvent{first, second} {
		require.NotNil(t, e.DeliveredAt, "event %d is covered by the planned stop", e.EventID)
		require.Equal(t, vigiltype.DeliverySuppressed, *e.DeliveryKind)
	}
	require.Nil(t, other.DeliveredAt, "a planned stop covers only its own agent")
	b.clock.Advance(11 * time.Second) // past the 120s TTL
	late := b.recordExit("research")
	require.Nil(t, late.DeliveredAt, "an expired marker covers nothing")

	all := b.events("")
	require.Len(t, all.Events, 5, "suppressed events are still recorded")
	require.Equal(t, late.EventID, all.Events[0].EventID, "newest first")
	undelivered := b.events("?undelivered=true")
	require.Len(t, undelivered.Events, 3)
	require.Len(t, b.events("?agent=critic").Events, 1)

	r = b.do("POST", "/v1/events/"+itoa(crash.EventID)+"/ack", `{"delivery_kind":"paged"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	b.clock.Advance(time.Minute)
	r = b.do("POST", "/v1/events/"+itoa(crash.EventID)+"/ack", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var acked vigiltype.ProcessEvent
	r.decode(t, &acked)
	require.Equal(t, "paged", *acked.DeliveryKind, "a second ack keeps the first")
	require.Len(t, b.events("?undelivered=true").Events, 2)

	page := b.events("?limit=2")
	require.Len(t, page.Events, 2)
	require.NotNil(t, page.NextCursor)
	require.Len(t, b.events("?limit=2&cursor="+*page.NextCursor).Events, 2)
}

func TestProcessEventsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cases := []struct {
		name, method, path, body string
		status                   int
		msg                      string
	}{
		{"bad kind", "POST", "/v1/events", `{"agent":"a","kind":"explosion"}`, 400, "kind: must be one of"},
		{"no agent", "POST", "/v1/events", `{"kind":"exit"}`, 400, "agent: is required"},
		{"negative run", "POST", "/v1/events", `{"agent":"a","kind":"exit","run_duration_ms":-1}`, 400, "run_duration_ms"},
		{"exit code", "POST", "/v1/events", `{"agent":"a","kind":"exit","exit_code":300}`, 400, "exit_code"},
		{"negative launch age", "POST", "/v1/events", `{"agent":"a","kind":"exit","launch_age_ms":-1}`, 400, "launch_age_ms"},
		{"detail too deep", "POST", "/v1/events", `{"agent":"a","kind":"exit","detail":` + strings.Repeat("{\"a\":", 70) + "1" + strings.Repeat("}", 70) + `}`, 400, "detail: must not nest"},
		{"planned stop without reason", "POST", "/v1/agents/a/planned-stop", `{}`, 400, "reason: is required"},
		{"planned stop ttl", "POST", "/v1/agents/a/planned-stop", `{"reason":"r","ttl_s":-5}`, 400, "ttl_s"},
		{"ack missing", "POST", "/v1/events/999/ack", "", 404, "event 999"},
		{"ack bad id", "POST", "/v1/events/x/ack", "", 400, "event_id"},
		{"undelivered not bool", "GET", "/v1/events?undelivered=maybe", "", 400, "undelivered: must be true or false"},
	}
	for _, c := range cases {
		r := b.do(c.method, c.path, c.body)
		require.Equal(t, c.status, r.status, "%s: %s", c.name, r.body)
		_, msg := r.errorCode(t)
		require.Contains(t, msg, c.msg, c.name)
	}
	require.Empty(t, b.events("").Events, "refused events were written")
}

// DESIGN E2: a planned stop covers the processes that were running when it
// was written. A supervisor says how long ago the event's process was
// launched (launch_age_ms, measured on its own clock); the server places the
// launch on its own clock, so the crash of the process a restart started is
// an ordinary event within the marker's TTL, while the exit of the process
// the restart stopped is suppressed.
func TestPlannedStopCoversTheProcessesRunningWhenWritten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	record := func(launchAgeMS int64) vigiltype.ProcessEvent {
		t.Helper()
		r := b.do("POST", "/v1/events", `{"agent":"research","kind":"exit","signal":"killed","launch_age_ms":`+itoa(launchAgeMS)+`}`)
		require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
		var e vigiltype.ProcessEvent
		r.decode(t, &e)
		return e
	}
	r := b.do("POST", "/v1/agents", `{"name":"research"}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	r = b.do("POST", "/v1/agents/research/planned-stop", `{"reason":"restart"}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)

	b.clock.Advance(2 * time.Second)
	stopped := record(3_600_000) // launched an hour ago: running when the marker was written
	require.NotNil(t, stopped.DeliveryKind)
	require.Equal(t, vigiltype.DeliverySuppressed, *stopped.DeliveryKind)

	b.clock.Advance(20 * time.Second)
	crash := record(21_000) // launched a second after the marker
	require.Nil(t, crash.DeliveredAt, "the crash after the restart is an ordinary event")
	require.Len(t, b.events("?undelivered=true").Events, 1)

	legacy := b.recordExit("research") // no launch_age_ms: the TTL alone decides
	require.NotNil(t, legacy.DeliveredAt)
}
