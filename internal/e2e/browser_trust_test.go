package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/lease"
	"github.com/vigil-fleet/vigil/internal/registry"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// attackJS is what a page the operator visits tries against the vigil
// server at %VIGIL%: the cross-site POSTs (text/plain with no-cors,
// which a browser sends without asking; JSON, which needs a preflight; a
// bodyless one; a text/plain form shaped into JSON) and reads. It returns
// what the page got back from each, as JSON.
const attackJS = `(async () => {
  const v = "%VIGIL%";
  const launch = JSON.stringify({name: "evil", function: "x", tick_cron: "",
    config: {launch: {host: "h", command: ["/bin/sh", "-c", "id > /tmp/pwned"]}}});
  const out = {};
  async function attempt(name, path, opts) {
    try {
      const r = await fetch(v + path, opts);
      out[name] = {status: r.status, type: r.type, body: await r.text()};
    } catch (e) {
      out[name] = {error: String(e)};
    }
  }
  await attempt("post text/plain no-cors", "/v1/agents",
    {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain;charset=UTF-8"}, body: launch});
  await attempt("post text/plain", "/v1/agents",
    {method: "POST", headers: {"Content-Type": "text/plain"}, body: launch});
  await attempt("post json", "/v1/agents",
    {method: "POST", headers: {"Content-Type": "application/json"}, body: launch});
  await attempt("enqueue no-cors", "/v1/tasks", {method: "POST", mode: "no-cors", body: '{"task_type":"evil"}'});
  await attempt("bodyless no-cors", "/v1/agents/victim/mark-stopped", {method: "POST", mode: "no-cors"});
  await attempt("get", "/v1/agents", {});
  await attempt("get no-cors", "/v1/agents", {mode: "no-cors"});
  await attempt("get snapshot", "/v1/snapshot", {credentials: "include"});
  // An HTML form with enctype text/plain sends name=value: shaped so that
  // the body is the JSON of an agent.
  await new Promise((resolve) => {
    const sink = document.createElement("iframe");
    sink.name = "sink";
    document.body.appendChild(sink);
    sink.onload = resolve;
    const form = document.createElement("form");
    form.method = "POST";
    form.action = v + "/v1/agents";
    form.enctype = "text/plain";
    form.target = "sink";
    const input = document.createElement("input");
    input.name = '{"name":"formevil","tick_cron":"","function":"';
    input.value = '"}';
    form.appendChild(input);
    document.body.appendChild(form);
    form.submit();
  });
  out["form"] = {submitted: true};
  return JSON.stringify(out);
})()`

// pageResult is what the attacking page got back from one attempt.
type pageResult struct {
	Status int    `json:"status"`
	Type   string `json:"type"`
	Body   string `json:"body"`
	Error  string `json:"error"`
}

// A page in real headless Chromium, served from another origin (another
// port of 127.0.0.1), tries to register an agent with a launch command,
// enqueue a task, stop an agent and read the fleet: nothing is written
// and the page reads nothing. The same page reached through a name that
// resolves to the server (DNS rebinding) gets 421 for everything.
func TestBrowserOnAnotherOriginCanNeitherWriteNorRead(t *testing.T) {
	t.Parallel()
	ctx := browser(t, chromedp.Flag("host-resolver-rules", "MAP rebind.test 127.0.0.1"))
	srv := testserver.Start(t)
	bg := context.Background()
	_, err := srv.Registry.Register(bg, registry.RegisterParams{Name: "victim", Function: "secret function"})
	require.NoError(t, err)

	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte(`<!doctype html><title>cat pictures</title><body><p>nothing to see</p></body>`))
	}))
	t.Cleanup(attacker.Close)
	require.NotEqual(t, attacker.URL, srv.URL)

	// The first Run starts the browser and must not carry a timeout.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(attacker.URL+"/")))
	wait, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	raw, err := chromedp.Run(wait, chromedp.Evaluate[string](
		strings.ReplaceAll(attackJS, "%VIGIL%", srv.URL), chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	var got map[string]pageResult
	require.NoError(t, json.Unmarshal([]byte(raw), &got), raw)
	t.Logf("what the page got: %s", raw)
	require.Len(t, got, 9)
	for name, r := range got {
		require.NotContains(t, r.Body, "victim", "%s: the page read the fleet", name)
		require.NotContains(t, r.Body, "secret function", "%s: the page read the fleet", name)
	}
	require.NotEmpty(t, got["get"].Error, "a cross-origin read fails in the page")
	require.NotEmpty(t, got["post json"].Error, "the preflight of a JSON POST fails")

	// Nothing was written: no agent but the victim, still active; no task.
	agents, err := srv.Registry.List(bg)
	require.NoError(t, err)
	require.Equal(t, []string{"victim active"}, agentStates(agents), "the page registered or stopped an agent")
	tasks, _, err := srv.Lease.List(bg, lease.ListParams{})
	require.NoError(t, err)
	require.Empty(t, tasks, "the page enqueued a task")

	// DNS rebinding: a name the attacker controls now resolves to the
	// server, so its page is same-origin with it. The server does not
	// answer for that name.
	rebound := strings.Replace(srv.URL, "127.0.0.1", "rebind.test", 1)
	require.NoError(t, chromedp.Do(wait, chromedp.Navigate(rebound+"/")))
	raw, err = chromedp.Run(wait, chromedp.Evaluate[string](`(async () => {
	  const get = await fetch("/v1/agents");
	  const post = await fetch("/v1/agents", {method: "POST", headers: {"Content-Type": "application/json"},
	    body: JSON.stringify({name: "rebound", function: "x", tick_cron: ""})});
	  return JSON.stringify({get: {status: get.status, body: await get.text()},
	    post: {status: post.status, body: await post.text()}});
	})()`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	t.Logf("what the rebound page got: %s", raw)
	var rebind map[string]pageResult
	require.NoError(t, json.Unmarshal([]byte(raw), &rebind), raw)
	for name, r := range rebind {
		require.Equal(t, http.StatusMisdirectedRequest, r.Status, "%s: %s", name, r.Body)
		require.NotContains(t, r.Body, "victim", name)
	}
	agents, err = srv.Registry.List(bg)
	require.NoError(t, err)
	require.Equal(t, []string{"victim active"}, agentStates(agents), "the rebound page registered an agent")
}

// agentStates is "name status" of each agent.
func agentStates(agents []*vigiltype.Agent) []string {
	var out []string
	for _, a := range agents {
		out = append(out, a.Name+" "+string(a.Status))
	}
	return out
}
