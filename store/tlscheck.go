package store

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// CertSoon is how close to its expiry a certificate is warned about
// ([CertWarnings]): 14 days, time for a renewal to go through a change
// process and reach every machine before the handshakes start to fail.
const CertSoon = 14 * 24 * time.Hour

// CertWarnings reads the first certificate of the PEM file certFile (a
// server's, as `meshfold serve --tls-cert` names it) and says what would
// make clients refuse it: it expired, it is not valid yet, it expires
// within [CertSoon] of now, or it does not cover host (the address serve
// listens on; not checked when host is empty or an unspecified address,
// 0.0.0.0 or ::, which clients never dial as such). Each warning is one
// sentence naming the file and the date or names at stake; none: nil.
//
// Errors: an unreadable file, or one without a PEM certificate.
func CertWarnings(certFile, host string, now time.Time) ([]string, error) {
	data, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	block, rest := pem.Decode(data)
	for block != nil && block.Type != "CERTIFICATE" {
		block, rest = pem.Decode(rest)
	}
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certFile, err)
	}
	var ws []string
	switch {
	case now.After(cert.NotAfter):
		ws = append(ws, fmt.Sprintf("the certificate %s (%s) expired %s ago, at %s: every client will refuse it "+
			"(x509: certificate has expired); renew it and restart with the new --tls-cert",
			certFile, cert.Subject, days(now.Sub(cert.NotAfter)), cert.NotAfter.UTC().Format(time.RFC3339)))
	case now.Before(cert.NotBefore):
		ws = append(ws, fmt.Sprintf("the certificate %s (%s) is not valid until %s (in %s): every client will refuse it "+
			"until then (is this machine's clock right?)",
			certFile, cert.Subject, cert.NotBefore.UTC().Format(time.RFC3339), days(cert.NotBefore.Sub(now))))
	case cert.NotAfter.Sub(now) < CertSoon:
		ws = append(ws, fmt.Sprintf("the certificate %s (%s) expires in %s, at %s: renew it before then, "+
			"or every client's next connection is refused",
			certFile, cert.Subject, days(cert.NotAfter.Sub(now)), cert.NotAfter.UTC().Format(time.RFC3339)))
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		if err := cert.VerifyHostname(host); err != nil {
			ws = append(ws, fmt.Sprintf("the certificate %s does not cover %s, the address serve listens on: it names %s; "+
				"clients must connect with one of those names (a client dialing %s refuses it: %v)",
				certFile, host, certNames(cert), host, err))
		}
	}
	return ws, nil
}

// days says d in days when it is a day or more, else in hours, minutes,
// seconds.
func days(d time.Duration) string {
	if d >= 48*time.Hour {
		return fmt.Sprintf("%d days", int(d/(24*time.Hour)))
	}
	return d.Round(time.Second).String()
}

// certNames lists the names and addresses a certificate is valid for.
func certNames(c *x509.Certificate) string {
	var n []string
	n = append(n, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		n = append(n, ip.String())
	}
	if len(n) == 0 {
		return "no DNS name nor IP address (subject " + c.Subject.String() + ")"
	}
	return strings.Join(n, ", ")
}

// TLSHint says what to check after a connection attempt failed with err
// in its TLS handshake, and "" for any other error. The server closing
// the connection right after the handshake, or answering with a TLS
// alert about the client's certificate, is a server (mutual TLS) that
// requires a client certificate or rejected the one given: nats.go says
// only "connection closed by remote after TLS handshake: broken pipe",
// and only the server's log said why (a fresh user's finding F4). The
// hint names the client certificate c connects with (its flag or its
// context's), and what is wrong with it when that is visible here (none
// given, expired, not valid yet) or what to check on the server (the CA
// it trusts). A server certificate the client refused (expired, of an
// unknown CA, for other names) names the flag that fixes each.
func (c ConnectConfig) TLSHint(err error, now time.Time) string {
	if err == nil {
		return ""
	}
	var inval x509.CertificateInvalidError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	switch {
	case errors.As(err, &inval) && inval.Reason == x509.Expired:
		return " (the server's certificate is not valid now: the server must be restarted with a renewed --tls-cert; " +
			"if this machine's clock is wrong, fix the clock)"
	case errors.As(err, &unknown):
		return " (the server's certificate is signed by a CA this client does not trust: give that CA with --tls-ca FILE or $NATS_CA)"
	case errors.As(err, &host):
		return " (the server's certificate does not name the host in the server URL: connect with a name it covers, in --server or $NATS_URL)"
	}
	// The server's alert ("remote error: tls: certificate required",
	// "... expired certificate") is read when the client reads before the
	// server closes; a write first meets the closed connection, which
	// nats.go marks as ErrTLS when the handshake had completed.
	alert := strings.Contains(err.Error(), "remote error: tls:")
	closed := errors.Is(err, nats.ErrTLS) &&
		(errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET))
	if !alert && !closed {
		return ""
	}
	cert := c.TLSCert
	via := "--tls-cert"
	if cert == "" && c.TLSKey == "" && c.Context != "" {
		if ctx, err := loadContext(c.Context); err == nil && ctx.Cert != "" {
			cert, via = ctx.Cert, "the cert of context "+c.Context
		}
	}
	if cert == "" {
		return " (the server closed the connection after the TLS handshake: it requires a client certificate " +
			"(mutual TLS) and none was given: give one signed by the CA the server trusts (serve's --tls-client-ca) " +
			"with --tls-cert FILE --tls-key FILE, or $NATS_CERT and $NATS_KEY)"
	}
	leaf, perr := leafCert(cert, c.TLSKey)
	if perr != nil {
		return fmt.Sprintf(" (the server rejected the client certificate %s (%s): check it: %v)", cert, via, perr)
	}
	switch {
	case now.After(leaf.NotAfter):
		return fmt.Sprintf(" (the server rejected the client certificate %s (%s): it expired at %s: renew it)",
			cert, via, leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return fmt.Sprintf(" (the server rejected the client certificate %s (%s): it is not valid until %s: "+
			"check this machine's clock and the server's)", cert, via, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf(" (the server rejected the client certificate %s (%s), which is valid until %s: "+
		"is its issuer, %s, the CA the server trusts (serve's --tls-client-ca)? The server's log says why it refused)",
		cert, via, leaf.NotAfter.UTC().Format(time.RFC3339), leaf.Issuer)
}

// leafCert reads the first certificate of the PEM file path; with key, as
// the pair tls.LoadX509KeyPair checks.
func leafCert(path, key string) (*x509.Certificate, error) {
	if key != "" {
		pair, err := tls.LoadX509KeyPair(path, key)
		if err != nil {
			return nil, err
		}
		return x509.ParseCertificate(pair.Certificate[0])
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}
