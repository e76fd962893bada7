package storetest

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

// TLSFiles are PEM files of a throwaway CA, a server certificate it signed
// for 127.0.0.1 and localhost, and a client certificate it signed.
type TLSFiles struct {
	CA                    string
	ServerCert, ServerKey string
	ClientCert, ClientKey string

	dir   string
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

// TLS writes a fresh CA, server and client certificates (ECDSA P-256,
// valid for an hour) under t.TempDir(). It fails the test on any error.
func TLS(t testing.TB) TLSFiles {
	t.Helper()
	dir := t.TempDir()
	caKey, caDER := mustCert(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "meshfold test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil, nil)
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	f := TLSFiles{CA: filepath.Join(dir, "ca.pem"), dir: dir, ca: ca, caKey: caKey}
	writePEM(t, f.CA, "CERTIFICATE", caDER)
	for _, c := range []struct {
		name      string
		tmpl      *x509.Certificate
		cert, key *string
	}{
		{"server", &x509.Certificate{Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			KeyUsage: x509.KeyUsageDigitalSignature}, &f.ServerCert, &f.ServerKey},
		{"client", &x509.Certificate{Subject: pkix.Name{CommonName: "meshfold client"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature},
			&f.ClientCert, &f.ClientKey},
	} {
		c.tmpl.NotBefore, c.tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
		key, der := mustCert(t, c.tmpl, ca, caKey)
		*c.cert, *c.key = filepath.Join(dir, c.name+".pem"), filepath.Join(dir, c.name+"-key.pem")
		writePEM(t, *c.cert, "CERTIFICATE", der)
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(t, *c.key, "EC PRIVATE KEY", kb)
	}
	return f
}

// mustCert makes a key and a certificate of tmpl signed by parent (self
// signed when parent is nil).
func mustCert(t testing.TB, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62)); err != nil {
		t.Fatal(err)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

// Issue writes a certificate signed by f's CA (or, with selfCA, by a CA
// of its own, which f's server does not trust) and its key, as
// name.pem and name-key.pem, valid from notBefore to notAfter: for a
// server when hosts (DNS names or IP addresses) are given, for a client
// otherwise. It fails the test on any error.
func (f TLSFiles) Issue(t testing.TB, name string, notBefore, notAfter time.Time, selfCA bool, hosts ...string) (cert, key string) {
	t.Helper()
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: name}, NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	ca, caKey := f.ca, f.caKey
	if selfCA {
		var der []byte
		caKey, der = mustCert(t, &x509.Certificate{Subject: pkix.Name{CommonName: "another CA"}, IsCA: true,
			BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}, nil, nil)
		var err error
		if ca, err = x509.ParseCertificate(der); err != nil {
			t.Fatal(err)
		}
	}
	k, der := mustCert(t, tmpl, ca, caKey)
	cert, key = filepath.Join(f.dir, name+".pem"), filepath.Join(f.dir, name+"-key.pem")
	writePEM(t, cert, "CERTIFICATE", der)
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, key, "EC PRIVATE KEY", kb)
	return cert, key
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
