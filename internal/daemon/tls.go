package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"
)

// TLSCheckIntervalDefault is how often, at most, the server looks at the
// --tls-cert and --tls-key files (modification time and size) to pick up a
// rotated certificate. It looks on a TLS handshake, so an idle server reads
// nothing; SIGHUP (Daemon.ReloadTLS) reloads at once.
const TLSCheckIntervalDefault = 5 * time.Second

// certReloader serves the certificate pair in certFile and keyFile through
// tls.Config.GetCertificate, and reads it again when either file changes
// or on reload. A pair that does not load keeps the previous one in service.
type certReloader struct {
	certFile, keyFile string
	every             time.Duration    // between looks at the files
	now               func() time.Time // the local clock
	logger            *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   pairStamp // of the files as last read, loaded or not
	checked time.Time // when the files were last looked at
}

// pairStamp is what a look at the two files sees; a file that cannot be
// stat'ed (mid-rotation) has the zero fileStamp.
type pairStamp struct{ cert, key fileStamp }

type fileStamp struct {
	mod  time.Time
	size int64
}

// newCertReloader loads the pair; an error names the flags.
func newCertReloader(certFile, keyFile string, every time.Duration, now func() time.Time, logger *slog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, every: every, now: now, logger: logger}
	r.stamp = r.look()
	cert, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cert, r.checked = cert, now()
	r.logLoaded("TLS certificate loaded", cert, "start")
	return r, nil
}

// GetCertificate is tls.Config.GetCertificate: the current pair, read
// again first when the files changed since the last look (at most once
// per r.every).
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := r.now(); now.Sub(r.checked) >= r.every {
		r.checked = now
		if st := r.look(); st != r.stamp {
			r.stamp = st
			_ = r.reloadLocked("the certificate files changed")
		}
	}
	return r.cert, nil
}

// Reload reads the pair now (SIGHUP). On error the previous pair stays in
// service, a warning is logged and the error returned.
func (r *certReloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stamp, r.checked = r.look(), r.now()
	return r.reloadLocked("reload asked (SIGHUP)")
}

func (r *certReloader) reloadLocked(why string) error {
	cert, err := r.load()
	if err != nil {
		r.logger.Warn("keeping the previous TLS certificate: the new one does not load", "why", why, "err", err,
			"serial", serialOf(r.cert))
		return err
	}
	r.cert = cert
	r.logLoaded("TLS certificate reloaded", cert, why)
	return nil
}

// load reads and checks the pair. Its errors name the flag of the file
// at fault, or both when they do not belong together.
func (r *certReloader) load() (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(r.certFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert: %w", err)
	}
	keyPEM, err := os.ReadFile(r.keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s, --tls-key %s: not a certificate and its key: %w", r.certFile, r.keyFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("--tls-cert %s: %w", r.certFile, err)
		}
	}
	return &cert, nil
}

func (r *certReloader) look() pairStamp {
	return pairStamp{cert: stampOf(r.certFile), key: stampOf(r.keyFile)}
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}
}

func (r *certReloader) logLoaded(msg string, cert *tls.Certificate, why string) {
	leaf := cert.Leaf
	attrs := []any{"why", why, "cert", r.certFile, "serial", serialOf(cert), "names", slices.Concat(leaf.DNSNames, ipStrings(leaf)),
		"not_after", leaf.NotAfter.UTC()}
	if r.now().After(leaf.NotAfter) {
		r.logger.Warn(msg+" but it has expired: clients will refuse it", attrs...)
		return
	}
	r.logger.Info(msg, attrs...)
}

func serialOf(cert *tls.Certificate) string {
	if cert == nil || cert.Leaf == nil {
		return ""
	}
	return cert.Leaf.SerialNumber.Text(16)
}

func ipStrings(c *x509.Certificate) []string {
	out := make([]string, len(c.IPAddresses))
	for i, ip := range c.IPAddresses {
		out[i] = ip.String()
	}
	return out
}

// checkTLSFlags requires both files or neither.
func checkTLSFlags(certFile, keyFile string) error {
	switch {
	case certFile != "" && keyFile == "":
		return errors.New("--tls-cert needs --tls-key (the certificate's private key)")
	case certFile == "" && keyFile != "":
		return errors.New("--tls-key needs --tls-cert (the certificate it is the key of)")
	}
	return nil
}
