// Package testcert makes throwaway TLS certificates for tests: a CA and
// server certificates it signs for 127.0.0.1, ::1 and localhost, written as
// PEM files where a test asks (under t.TempDir()). Nothing here is fit for
// anything but a test.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a throwaway certificate authority.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA certificate as a PEM file: what a client is given as
	// --ca-file or VIGIL_CA_FILE.
	File string
}

// NewCA makes a CA named name and writes its certificate to
// t.TempDir()/<name>-ca.pem.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name + " test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testcert: create CA: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcert: parse CA: %v", err)
	}
	ca := &CA{Cert: cert, key: key, File: filepath.Join(t.TempDir(), name+"-ca.pem")}
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Pair is a server certificate and its key, as PEM files.
type Pair struct {
	Cert     *x509.Certificate
	CertFile string // --tls-cert
	KeyFile  string // --tls-key
}

// Issue signs a server certificate for 127.0.0.1, ::1 and localhost and
// writes it and its key to certFile and keyFile (replacing them: a
// rotation). Each certificate has a fresh random serial number.
func (ca *CA) Issue(t testing.TB, certFile, keyFile string) Pair {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("testcert: create server certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcert: parse server certificate: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("testcert: marshal key: %v", err)
	}
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	writePEM(t, certFile, "CERTIFICATE", der)
	return Pair{Cert: cert, CertFile: certFile, KeyFile: keyFile}
}

// IssueIn is Issue to dir/server.pem and dir/server-key.pem.
func (ca *CA) IssueIn(t testing.TB, dir string) Pair {
	t.Helper()
	return ca.Issue(t, filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"))
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcert: generate key: %v", err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatalf("testcert: serial: %v", err)
	}
	return n.Add(n, big.NewInt(1))
}

// writePEM replaces path atomically (a rename), as a certificate manager
// does, so a reader never sees half a file.
func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("testcert: write %s: %v", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("testcert: %v", err)
	}
}
