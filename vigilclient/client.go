package vigilclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// HTTPTimeoutDefault bounds one HTTP request made with the default
// *http.Client (see WithHTTPClient). Every method also honours its ctx.
const HTTPTimeoutDefault = 30 * time.Second

// InstanceTokenHeader carries the instance token issued at registration on
// every write made on behalf of that instance (docs/api.md, DESIGN L2).
const InstanceTokenHeader = "X-Vigil-Instance-Token"

// maxErrorBody is how much of an error response is read to build an APIError.
const maxErrorBody = 64 << 10

// Client talks to one vigil server over its HTTP JSON API (docs/api.md).
//
// It is given one or more server URLs. A request goes to the URL that last
// answered; when that URL cannot be reached it tries the others in turn and
// remembers the first that answers. "Cannot be reached" means the connection
// could not be made (dial, DNS), which is safe to retry for every call; for
// GET requests any transport failure also moves on. An HTTP error status is
// an answer, never a reason to try another URL.
//
// A Client is safe for concurrent use.
type Client struct {
	urls  []*url.URL
	last  atomic.Int64 // index into urls of the last URL that answered
	http  *http.Client
	token string
	tls   *tls.Config // WithTLSConfig: applied to http's transport in New
}

// Option configures a Client in New.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests with hc instead of a
// default *http.Client whose Timeout is HTTPTimeoutDefault.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// WithTLSConfig makes the Client use cfg for https:// servers, e.g. the
// one LoadCAFile returns for a server whose certificate a private CA
// signed (--ca-file, VIGIL_CA_FILE). With WithHTTPClient it applies to that
// client's Transport when that is nil or an *http.Transport (a copy is
// changed, never the caller's); New refuses any other RoundTripper.
func WithTLSConfig(cfg *tls.Config) Option { return func(c *Client) { c.tls = cfg } }

// LoadCAFile returns a TLS configuration, for WithTLSConfig, that trusts
// the CA certificates in the PEM file at path and no other: the system's
// roots are not consulted, as with curl --cacert. Use it for a server
// whose certificate a private CA signed; a certificate from a public CA
// needs nothing.
func LoadCAFile(path string) (*tls.Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the CA certificates: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw) {
		return nil, fmt.Errorf("%s holds no PEM certificate (-----BEGIN CERTIFICATE-----)", path)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// withTLS returns hc with its transport using cfg; hc is not changed.
func withTLS(hc *http.Client, cfg *tls.Config) (*http.Client, error) {
	var tr *http.Transport
	switch t := hc.Transport.(type) {
	case nil:
		tr = http.DefaultTransport.(*http.Transport).Clone()
	case *http.Transport:
		tr = t.Clone()
	default:
		return nil, fmt.Errorf("vigilclient: WithTLSConfig needs WithHTTPClient's Transport to be nil or an *http.Transport, not %T: set the TLS configuration in it", t)
	}
	tr.TLSClientConfig = cfg.Clone()
	out := *hc
	out.Transport = tr
	return &out, nil
}

// WithToken sends token as "Authorization: Bearer <token>" on every request:
// the server token of a server started with --token-file (docs/api.md).
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// New returns a Client for the servers at urls (e.g. "http://127.0.0.1:7711"),
// tried in that order. Each URL must be absolute http or https; a path prefix
// is kept (a server behind a reverse proxy at https://host/vigil works).
func New(urls []string, opts ...Option) (*Client, error) {
	if len(urls) == 0 {
		return nil, errors.New("vigilclient: at least one server URL is required")
	}
	c := &Client{}
	for _, raw := range urls {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil {
			return nil, fmt.Errorf("vigilclient: server URL %q: %w", raw, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("vigilclient: server URL %q: must be absolute http(s), like http://127.0.0.1:7711", raw)
		}
		u.Path = strings.TrimRight(u.Path, "/")
		u.RawQuery, u.Fragment = "", ""
		c.urls = append(c.urls, u)
	}
	for _, o := range opts {
		o(c)
	}
	if c.http == nil {
		c.http = &http.Client{Timeout: HTTPTimeoutDefault}
	}
	if c.tls != nil {
		hc, err := withTLS(c.http, c.tls)
		if err != nil {
			return nil, err
		}
		c.http = hc
	}
	return c, nil
}

// URLs returns the server URLs in the order they are tried, starting with
// the one that answered last.
func (c *Client) URLs() []string {
	start := int(c.last.Load())
	out := make([]string, 0, len(c.urls))
	for i := range c.urls {
		out = append(out, c.urls[(start+i)%len(c.urls)].String())
	}
	return out
}

// request is one API call.
type request struct {
	method   string
	path     string // below the server URL, e.g. "/v1/tasks/claim"
	query    url.Values
	instance string // instance token, sent as InstanceTokenHeader when set
	body     any    // marshalled to JSON when non-nil
}

// do sends req and decodes a 2xx JSON answer into out (when out is non-nil
// and the answer has a body). It returns the HTTP status. A non-2xx answer
// is returned as an *APIError wrapped with the method and path.
func (c *Client) do(ctx context.Context, req request, out any) (int, error) {
	var body []byte
	if req.body != nil {
		var err error
		if body, err = json.Marshal(req.body); err != nil {
			return 0, fmt.Errorf("%s %s: encode request: %w", req.method, req.path, err)
		}
	}
	start := int(c.last.Load())
	var errs []error
	for i := range c.urls {
		idx := (start + i) % len(c.urls)
		resp, err := c.send(ctx, c.urls[idx], req, body)
		if err != nil {
			if ctx.Err() != nil {
				return 0, fmt.Errorf("%s %s: %w", req.method, req.path, context.Cause(ctx))
			}
			errs = append(errs, err)
			if isConnectError(err) || req.method == http.MethodGet {
				continue
			}
			return 0, fmt.Errorf("%s %s: %w", req.method, req.path, err)
		}
		c.last.Store(int64(idx))
		status, err := readResponse(resp, out)
		if err != nil {
			return status, fmt.Errorf("%s %s: %w", req.method, req.path, err)
		}
		return status, nil
	}
	return 0, fmt.Errorf("%s %s: no server reachable: %w", req.method, req.path, errors.Join(errs...))
}

func (c *Client) send(ctx context.Context, base *url.URL, req request, body []byte) (*http.Response, error) {
	u := *base
	u.Path = base.Path + req.path
	u.RawQuery = req.query.Encode()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	hr, err := http.NewRequestWithContext(ctx, req.method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Accept", "application/json")
	hr.Header.Set("User-Agent", "vigilclient-go")
	if body != nil || req.method != http.MethodGet {
		// Every write says it is JSON, a bodyless one too: the server
		// refuses other writes (415), as a browser's cross-site form could
		// send them.
		hr.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		hr.Header.Set("Authorization", "Bearer "+c.token)
	}
	if req.instance != "" {
		hr.Header.Set(InstanceTokenHeader, req.instance)
	}
	return c.http.Do(hr)
}

// readResponse decodes resp and closes its body.
func readResponse(resp *http.Response, out any) (int, error) {
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return resp.StatusCode, decodeAPIError(resp.StatusCode, raw)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, fmt.Errorf("read response: %w", err)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return resp.StatusCode, nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return resp.StatusCode, fmt.Errorf("decode response: %w", err)
	}
	return resp.StatusCode, nil
}

// isConnectError reports whether err means no connection to the server was
// made, so the request never reached it and may go to another URL whatever
// its method.
func isConnectError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}
