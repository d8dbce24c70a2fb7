package httpapi

import "net/http"

// routeSnapshot adds the fleet snapshot (DESIGN F1–F5) when the API has a
// snapshot service.
func (a *api) routeSnapshot(mux *http.ServeMux) {
	if a.Snapshot == nil {
		return
	}
	mux.HandleFunc("GET /v1/snapshot", a.snapshot)
}

// snapshot answers the fleet snapshot document. Failed telemetry reads are
// listed in each row; only a failed registry listing fails the request.
func (a *api) snapshot(w http.ResponseWriter, r *http.Request) {
	s, err := a.Snapshot.Take(r.Context())
	a.respond(w, r, s, err)
}
