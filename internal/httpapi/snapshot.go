package httpapi

import "net/http"

// snapshot answers the fleet snapshot document. Failed telemetry reads are
// listed in each row; only a failed registry listing fails the request.
func (a *api) snapshot(w http.ResponseWriter, r *http.Request) {
	s, err := a.Snapshot.Take(r.Context())
	a.respond(w, r, s, err)
}
