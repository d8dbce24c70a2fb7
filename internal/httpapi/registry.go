package httpapi

import (
	"context"
	"net/http"
	"strconv"

	"github.com/vigil-fleet/vigil/internal/events"
	"github.com/vigil-fleet/vigil/internal/registry"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func (a *api) agentRegister(w http.ResponseWriter, r *http.Request) {
	create(a, w, r, func(ctx context.Context, p registry.RegisterParams) (*vigiltype.Agent, error) {
		p.WrittenBy = string(callerOf(r).role)
		return a.Registry.Register(ctx, p)
	})
}

func (a *api) agentList(w http.ResponseWriter, r *http.Request) {
	list, err := a.Registry.List(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if list == nil {
		list = []*vigiltype.Agent{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"agents": list})
}

func (a *api) agentGet(w http.ResponseWriter, r *http.Request) {
	ag, err := a.Registry.Get(r.Context(), r.PathValue("name"))
	a.respond(w, r, ag, err)
}

func (a *api) agentUpdate(w http.ResponseWriter, r *http.Request) {
	var p registry.UpdateParams
	if !a.decode(w, r, &p) {
		return
	}
	p.WrittenBy = string(callerOf(r).role)
	ag, err := a.Registry.Update(r.Context(), r.PathValue("name"), p)
	a.respond(w, r, ag, err)
}

func (a *api) agentMarkStopped(w http.ResponseWriter, r *http.Request) {
	ag, err := a.Registry.MarkStopped(r.Context(), r.PathValue("name"))
	a.respond(w, r, ag, err)
}

func (a *api) agentMarkActive(w http.ResponseWriter, r *http.Request) {
	ag, err := a.Registry.MarkActive(r.Context(), r.PathValue("name"))
	a.respond(w, r, ag, err)
}

func (a *api) plannedStop(w http.ResponseWriter, r *http.Request) {
	create(a, w, r, func(ctx context.Context, p events.PlannedStopParams) (*vigiltype.PlannedStop, error) {
		return a.Events.PlannedStop(ctx, r.PathValue("name"), p)
	})
}

func (a *api) plannedStopGet(w http.ResponseWriter, r *http.Request) {
	m, err := a.Events.ActivePlannedStop(r.Context(), r.PathValue("name"))
	a.respond(w, r, m, err)
}

func (a *api) eventRecord(w http.ResponseWriter, r *http.Request) {
	create(a, w, r, a.Events.Record)
}

func (a *api) eventList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, before, ok := a.idPage(w, r)
	if !ok {
		return
	}
	undelivered := false
	if s := q.Get("undelivered"); s != "" {
		v, err := strconv.ParseBool(s)
		if err != nil {
			a.fail(w, r, vigiltype.Invalid("undelivered", "must be true or false"))
			return
		}
		undelivered = v
	}
	list, next, err := a.Events.List(r.Context(), events.ListParams{
		Agent: q.Get("agent"), Undelivered: undelivered, Limit: limit, BeforeID: before,
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if list == nil {
		list = []*vigiltype.ProcessEvent{}
	}
	writeJSON(w, http.StatusOK, struct {
		Events     []*vigiltype.ProcessEvent `json:"events"`
		NextCursor *string                   `json:"next_cursor"`
	}{list, idCursor(next)})
}

func (a *api) eventAck(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		a.fail(w, r, vigiltype.Invalid("event_id", "must be a positive integer"))
		return
	}
	var p struct {
		DeliveryKind string `json:"delivery_kind"`
	}
	if !a.decode(w, r, &p) {
		return
	}
	e, err := a.Events.Ack(r.Context(), id, p.DeliveryKind)
	a.respond(w, r, e, err)
}
