package httpapi

import (
	"cmp"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
)

// The browser guard (docs/security.md): what a web page the operator visits
// can make the browser send to a vigil server — a cross-site "simple" POST,
// a request for a name rebound to the server's address, a request from a
// foreign Origin — is refused before any handler runs.

// LoopbackHosts are the names a server answers for on any listen address
// and any port: a client on the same machine may use any of them, through
// a port forward (ssh -L 9000:localhost:7711) or a local reverse proxy that
// keeps the Host too. A DNS rebinding page cannot send them: its Host is
// its own name. A page of another local origin can reach the server under
// these names, and the Origin rule refuses it.
var LoopbackHosts = []string{"localhost", "127.0.0.1", "::1"}

// hostPolicy decides which Host headers the server answers for (DNS
// rebinding: a page on attacker.example whose name now resolves to
// 127.0.0.1 sends "Host: attacker.example:7711").
type hostPolicy struct {
	exact   map[string]bool // "host:port", normalised
	anyPort map[string]bool // "host", normalised
}

// newHostPolicy parses entries of the form NAME:PORT (that port only) or
// NAME (any port); NAME is a DNS name or an IP literal, IPv6 in brackets
// when a port follows. nil entries: the loopback names on any port.
func newHostPolicy(entries []string) (*hostPolicy, error) {
	if entries == nil {
		entries = LoopbackHosts
	}
	p := &hostPolicy{exact: map[string]bool{}, anyPort: map[string]bool{}}
	for _, e := range entries {
		host, port, err := ParseHostEntry(e)
		if err != nil {
			return nil, err
		}
		if port == "" {
			p.anyPort[host] = true
		} else {
			p.exact[net.JoinHostPort(host, port)] = true
		}
	}
	return p, nil
}

// ParseHostEntry parses an --allowed-host value: NAME or NAME:PORT, NAME a
// DNS name or an IP literal ([v6]:PORT with a port). It returns the
// normalised name (lower case, no trailing dot, IPs in canonical form) and
// the port, "" when none was given.
func ParseHostEntry(e string) (host, port string, err error) {
	bad := func(why string) (string, string, error) {
		return "", "", fmt.Errorf("allowed host %q: %s (want NAME or NAME:PORT, e.g. vigil.internal or vigil.internal:7711)", e, why)
	}
	if strings.ContainsAny(e, "/@?# \t") || strings.Contains(e, "://") {
		return bad("not a host name")
	}
	host, port = splitHostHeader(e)
	if host == "" {
		return bad("empty name")
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return bad("the port must be a number from 1 to 65535")
		}
	}
	if strings.Contains(host, ":") && net.ParseIP(host) == nil {
		return bad("put an IPv6 address in brackets: [::1]:7711")
	}
	return host, port, nil
}

// splitHostHeader splits a Host header (or an Origin's host) into its
// normalised name and its port ("" when absent).
func splitHostHeader(h string) (host, port string) {
	host = h
	if hh, pp, err := net.SplitHostPort(h); err == nil {
		host, port = hh, pp
	} else if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		host = h[1 : len(h)-1]
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String()
	}
	return host, port
}

// allows reports whether the server answers for Host header h; a Host
// without a port means the scheme's default one.
func (p *hostPolicy) allows(h string, tls bool) bool {
	if h == "" {
		return false
	}
	host, port := splitHostHeader(h)
	if port == "" {
		port = "80"
		if tls {
			port = "443"
		}
	}
	return p.anyPort[host] || p.exact[net.JoinHostPort(host, port)]
}

// ServedHosts lists the Host values a server listening on addr (HOST:PORT,
// the port already bound) answers for, as entries for Config.Hosts: the
// loopback names on any port; addr itself and the machine's hostname with
// addr's port; when addr's host is unspecified (0.0.0.0, ::) also the
// address of every network interface with that port (read once, now); and
// then the allowed entries (--allowed-host) as given. A server listening on every
// interface never answers for an arbitrary name: that is what DNS
// rebinding needs.
func ServedHosts(addr string, allowed []string) ([]string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", addr, err)
	}
	names := []string{host}
	if h, err := os.Hostname(); err == nil && h != "" {
		names = append(names, h)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return nil, fmt.Errorf("list interface addresses for listen address %q: %w", addr, err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				names = append(names, n.IP.String())
			}
		}
	}
	out := append([]string(nil), LoopbackHosts...)
	for _, n := range names {
		if n == "" || n == "0.0.0.0" || n == "::" {
			continue
		}
		out = append(out, net.JoinHostPort(n, port))
	}
	for _, e := range allowed {
		if _, _, err := ParseHostEntry(e); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// sameOrigin reports whether Origin header origin names this server as
// reached through Host header host: same name and port, a scheme's default
// port counted as given (http://h matches Host h and h:80).
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return false // "null", a malformed or opaque origin: never ours
	}
	def := "80"
	if u.Scheme == "https" {
		def = "443"
	}
	oh, op := splitHostHeader(u.Host)
	hh, hp := splitHostHeader(host)
	return oh == hh && cmp.Or(op, def) == cmp.Or(hp, def)
}

// foreignOrigin reports whether r comes from a page that is not this
// server's: an Origin header naming another origin, or fetch metadata
// (Sec-Fetch-Site) saying cross-site or same-site. A request without
// either (curl, the SDKs) or marked same-origin or none (typed into the
// address bar) is not foreign.
func foreignOrigin(r *http.Request) bool {
	if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r.Host) {
		return true
	}
	switch r.Header.Get("Sec-Fetch-Site") {
	case "cross-site", "same-site":
		return true
	}
	return false
}

// isWrite reports whether r changes state: the methods a /v1 write uses.
func isWrite(r *http.Request) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// jsonContentType reports whether a write's Content-Type is acceptable:
// application/json, optionally with charset=utf-8. A write with no body
// and no Content-Type at all (a liveness heartbeat, an exit) is accepted
// too: it carries nothing to misread, and a browser sends such a request
// only with an Origin header, which the Origin rule refuses.
func jsonContentType(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return r.ContentLength == 0
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return false
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return false
		}
	}
	return true
}

// guard refuses, in this order, a request for a Host the server does not
// answer for (421; /healthz exempt), one from a foreign origin (403; GETs of
// the dashboard's page and assets exempt), one without a bearer token the
// server holds when it has token files (401; it sets the request's role),
// and a /v1 write that is not JSON (415). Whether the role may call the
// route is the route's own check (authorize).
// It returns false when it has answered.
func (a *api) guard(w http.ResponseWriter, r *http.Request) bool {
	path := r.URL.Path
	if path != "/healthz" && !a.hosts.allows(r.Host, r.TLS != nil) {
		a.refused(r, "foreign Host")
		writeError(w, http.StatusMisdirectedRequest, "misdirected_request",
			fmt.Sprintf("this server does not answer for Host %q: use its listen address or localhost, or start it with --allowed-host", r.Host))
		return false
	}
	dashboardGet := (r.Method == http.MethodGet || r.Method == http.MethodHead) && a.Dashboard != nil &&
		(path == "/" || strings.HasPrefix(path, "/assets/"))
	if !dashboardGet && foreignOrigin(r) {
		a.refused(r, "foreign Origin")
		writeError(w, http.StatusForbidden, "forbidden_origin",
			"requests from another origin are refused: call the API from this server's own pages or from a program")
		return false
	}
	if !a.authenticate(w, r) {
		return false
	}
	if strings.HasPrefix(path, "/v1/") && isWrite(r) && !jsonContentType(r) {
		a.refused(r, "not JSON")
		writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type",
			"a write must be sent with Content-Type: application/json")
		return false
	}
	return true
}

// refused logs a request the guard turned away: enough to find the page or
// client behind it, at a level an operator sees.
func (a *api) refused(r *http.Request, why string) {
	a.Logger.Warn("refused request: "+why, "method", r.Method, "path", r.URL.Path, "host", r.Host,
		"origin", r.Header.Get("Origin"), "content_type", r.Header.Get("Content-Type"), "remote", r.RemoteAddr)
}

// writeUnauthorized answers 401 with the challenge RFC 6750 asks for.
func writeUnauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="vigil"`)
	writeError(w, http.StatusUnauthorized, "unauthorized", msg)
}
