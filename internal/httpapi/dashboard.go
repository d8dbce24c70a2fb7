package httpapi

import (
	"net/http"
	"strings"

	"github.com/vigil-fleet/vigil/internal/dashboard"
)

// routeDashboard adds the agents' timeline (GET /v1/timeline) and the web
// dashboard's page and assets (/ and /assets/) when the API has them.
func (a *api) routeDashboard(mux *http.ServeMux) {
	if a.Timeline != nil {
		mux.HandleFunc("GET /v1/timeline", a.timeline)
	}
	if a.Dashboard != nil {
		mux.Handle("GET /{$}", a.Dashboard)
		mux.Handle("GET /assets/", a.Dashboard)
	}
}

// public reports whether path is served without the bearer token: the
// health check, and the dashboard's page and assets, which hold no fleet
// data (the page's script sends the token on its API calls).
func (a *api) public(path string) bool {
	if path == "/healthz" {
		return true
	}
	return a.Dashboard != nil && (path == "/" || strings.HasPrefix(path, "/assets/"))
}

// timeline answers every registered agent's strip over the last window_s
// seconds (default 6 h, at most 72 h).
func (a *api) timeline(w http.ResponseWriter, r *http.Request) {
	window, ok := a.querySeconds(w, r, "window_s", dashboard.WindowDefault, dashboard.WindowMax.Seconds())
	if !ok {
		return
	}
	tl, err := a.Timeline.Timeline(r.Context(), window)
	a.respond(w, r, tl, err)
}
