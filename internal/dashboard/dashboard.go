// Package dashboard serves vigil's read-only web dashboard at / (DESIGN §7):
// one page whose script polls the JSON API (/v1/snapshot, /v1/processes,
// /v1/tasks, /v1/events, /v1/sweepers, /v1/timeline) and redraws its cards.
// The assets are embedded in the binary and load nothing from elsewhere
// (the Content-Security-Policy forbids it), so the dashboard works offline.
//
// The page and its assets hold no fleet data and are served without the
// bearer token; the script sends the token, read once from the URL fragment
// (#token=…) and kept in the tab's sessionStorage, on every API call.
package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed assets
var assets embed.FS

// contentSecurityPolicy allows the page's own script, style and API calls
// and nothing else: no CDN, no inline script, no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the page at / and its files under /assets/.
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache") // revalidate: a new vigil binary brings new assets
		if r.URL.Path == "/" {
			http.ServeFileFS(w, r, sub, "index.html")
			return
		}
		http.StripPrefix("/assets", files).ServeHTTP(w, r)
	})
}
