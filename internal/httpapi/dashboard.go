package httpapi

import (
	"net/http"
	"strings"

	"github.com/vigil-fleet/vigil/internal/dashboard"
)

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
