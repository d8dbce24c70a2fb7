package httpapi

import (
	"net/http"

	"github.com/vigil-fleet/vigil/internal/auth"
)

// Route is one endpoint of the API and the least role a bearer token needs
// to call it (docs/api.md, "Roles"). On a server without token files every
// request has the operator role.
type Route struct {
	// Pattern is the route as the mux takes it: "METHOD /path/{wildcard}"
	// ("/mcp" takes every method).
	Pattern string
	// Need is the least role that may call it; RoleNone: no token needed.
	Need auth.Role
	// Holder: a token of the agent role may call it too when it sends the
	// instance token of the task's holder (X-Vigil-Instance-Token): the
	// holder may reclaim its own task.
	Holder bool
}

// route is a Route with the handler that serves it; handler returns nil
// when the API has no service for it (no metrics, snapshot, timeline,
// dashboard or MCP in its Config).
type route struct {
	Route
	handler func(a *api) http.Handler
}

// fn adapts a handler method to a route's handler.
func fn(f func(a *api, w http.ResponseWriter, r *http.Request)) func(a *api) http.Handler {
	return func(a *api) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f(a, w, r) })
	}
}

const (
	public   = auth.RoleNone
	read     = auth.RoleRead
	agent    = auth.RoleAgent
	operator = auth.RoleOperator
)

// routes is every endpoint the API serves and the role each needs: the one
// place that decides who may call what. New registers exactly these, and
// the role test calls each of them with every kind of token.
var routes = []route{
	{Route{"GET /healthz", public, false}, fn((*api).healthz)},
	{Route{"GET /metrics", read, false}, func(a *api) http.Handler {
		if a.Metrics == nil {
			return nil
		}
		return a.Metrics.Handler()
	}},

	// Processes (DESIGN L1–L4): an agent registers and beats for its own
	// instances (each call after register also proves the instance token).
	{Route{"POST /v1/processes", agent, false}, fn((*api).processRegister)},
	{Route{"GET /v1/processes", read, false}, fn((*api).processList)},
	{Route{"POST /v1/processes/prune", operator, false}, fn((*api).processPrune)},
	{Route{"GET /v1/processes/prune", read, false}, fn(func(_ *api, w http.ResponseWriter, r *http.Request) { onlyPost(w, r) })},
	{Route{"GET /v1/processes/{id}", read, false}, fn((*api).processGet)},
	{Route{"POST /v1/processes/{id}/heartbeat", agent, false}, fn((*api).processHeartbeat)},
	{Route{"POST /v1/processes/{id}/exit", agent, false}, fn((*api).processExit)},
	{Route{"GET /v1/process-status/{kind}", read, false}, fn((*api).processStatus)},

	// Tasks (DESIGN T1–T8): agents enqueue, claim and hold leases with
	// their instance token; taking a task from its holder is the
	// operator's, or the holder's own.
	{Route{"POST /v1/tasks", agent, false}, fn((*api).taskEnqueue)},
	{Route{"GET /v1/tasks", read, false}, fn((*api).taskList)},
	{Route{"POST /v1/tasks/claim", agent, false}, fn((*api).taskClaim)},
	{Route{"GET /v1/tasks/claim", read, false}, fn(func(_ *api, w http.ResponseWriter, r *http.Request) { onlyPost(w, r) })},
	{Route{"POST /v1/tasks/complete", agent, false}, fn((*api).taskCompleteBatch)},
	{Route{"GET /v1/tasks/{id}", read, false}, fn((*api).taskGet)},
	{Route{"GET /v1/tasks/stalled", read, false}, fn((*api).taskStalled)},
	{Route{"POST /v1/tasks/{id}/reclaim", operator, true}, fn((*api).taskReclaimStalled)},
	{Route{"POST /v1/tasks/{id}/{op}", agent, false}, fn((*api).taskLeaseOp)},

	{Route{"GET /v1/sweepers", read, false}, fn((*api).sweepers)},
	{Route{"GET /v1/heartbeat-versions", read, false}, fn((*api).heartbeatVersions)},

	// The registry (DESIGN R1) is operator data: a record may carry the
	// command a supervisor launches.
	{Route{"POST /v1/agents", operator, false}, fn((*api).agentRegister)},
	{Route{"GET /v1/agents", read, false}, fn((*api).agentList)},
	{Route{"GET /v1/agents/{name}", read, false}, fn((*api).agentGet)},
	{Route{"PATCH /v1/agents/{name}", operator, false}, fn((*api).agentUpdate)},
	{Route{"POST /v1/agents/{name}/mark-stopped", operator, false}, fn((*api).agentMarkStopped)},
	{Route{"POST /v1/agents/{name}/mark-active", operator, false}, fn((*api).agentMarkActive)},
	{Route{"POST /v1/agents/{name}/planned-stop", operator, false}, fn((*api).plannedStop)},
	{Route{"GET /v1/agents/{name}/planned-stop", read, false}, fn((*api).plannedStopGet)},

	// Events (DESIGN E1, E2): supervisors record them; delivering one is
	// the operator's.
	{Route{"POST /v1/events", agent, false}, fn((*api).eventRecord)},
	{Route{"GET /v1/events", read, false}, fn((*api).eventList)},
	{Route{"POST /v1/events/{id}/ack", operator, false}, fn((*api).eventAck)},

	{Route{"GET /v1/snapshot", read, false}, func(a *api) http.Handler {
		if a.Snapshot == nil {
			return nil
		}
		return http.HandlerFunc(a.snapshot)
	}},
	{Route{"GET /v1/timeline", read, false}, func(a *api) http.Handler {
		if a.Timeline == nil {
			return nil
		}
		return http.HandlerFunc(a.timeline)
	}},
	// The dashboard's page and assets hold no fleet data; the page sends
	// the tab's token on its own reads (a read token is enough).
	{Route{"GET /{$}", public, false}, func(a *api) http.Handler { return a.Dashboard }},
	{Route{"GET /assets/", public, false}, func(a *api) http.Handler { return a.Dashboard }},
	// MCP's tools only read (list_agents, fleet_snapshot, …).
	{Route{"/mcp", read, false}, func(a *api) http.Handler { return a.MCP }},
}

// Routes lists every endpoint the API can serve with the role it needs,
// in the order of docs/api.md's table. A server without metrics, a
// snapshot, a timeline, a dashboard or MCP serves fewer.
func Routes() []Route {
	out := make([]Route, len(routes))
	for i, r := range routes {
		out[i] = r.Route
	}
	return out
}

// register adds every route the API has a handler for to mux, each behind
// its role check.
func (a *api) register(mux *http.ServeMux) {
	for _, rt := range routes {
		h := rt.handler(a)
		if h == nil {
			continue
		}
		mux.Handle(rt.Pattern, a.authorize(rt.Route, h))
	}
}
