// Package certs issues the certificate authority of a KVCluster and the certificates its etcd
// members and clients use for mutual TLS, and checks whether given certificates fit a cluster.
//
// Keys are ECDSA P-256 and are written as PKCS#8; etcd accepts both. Certificates are backdated by
// an hour, so a member whose clock runs a little behind the operator's still accepts them.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"
)

// Usage is what a leaf certificate is for.
type Usage int

const (
	Server Usage = iota + 1 // a member's client port: serverAuth
	Peer                    // member to member, both directions: serverAuth + clientAuth
	Client                  // the operator, backup Jobs, applications: clientAuth
)

// ClockSkew is how far certificates are backdated, for members whose clocks run behind: a
// certificate was issued at its NotBefore plus ClockSkew.
const ClockSkew = time.Hour

// PEM block types.
const (
	certificateBlock = "CERTIFICATE"
	pkcs8KeyBlock    = "PRIVATE KEY"
	ecKeyBlock       = "EC PRIVATE KEY"
)

// extKeyUsages are the extended key usages a certificate for u must have; etcd 3.7 rejects a peer
// certificate that lacks either of its two.
func (u Usage) extKeyUsages() ([]x509.ExtKeyUsage, error) {
	switch u {
	case Server:
		return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, nil
	case Peer:
		return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, nil
	case Client:
		return []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil
	}
	return nil, fmt.Errorf("unknown certificate usage %d", int(u))
}

// name is u in error messages.
func (u Usage) name() string {
	switch u {
	case Server:
		return "server"
	case Peer:
		return "peer"
	case Client:
		return "client"
	}
	return fmt.Sprintf("usage %d", int(u))
}

// CA is a certificate authority: its certificate and key, parsed and PEM-encoded.
type CA struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
	KeyPEM  []byte // PKCS#8 "PRIVATE KEY" when made by NewCA; ParseCA also reads "EC PRIVATE KEY"
}

// NewCA creates a self-signed CA valid from now-1h (clock skew) until now+validity. It may sign
// leaves only (MaxPathLenZero): nothing below it can issue certificates the cluster would trust.
func NewCA(commonName string, now time.Time, validity time.Duration) (CA, error) {
	if commonName == "" {
		return CA{}, errors.New("a CA needs a common name")
	}
	if validity <= 0 {
		return CA{}, fmt.Errorf("CA validity %s is not positive", validity)
	}
	template := &x509.Certificate{
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-ClockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
	}
	issued, err := create(template, nil, nil)
	if err != nil {
		return CA{}, fmt.Errorf("CA %q: %w", commonName, err)
	}
	return CA{Cert: issued.cert, Key: issued.key, CertPEM: issued.certPEM, KeyPEM: issued.keyPEM}, nil
}

// ParseCA reads a CA back from its PEM certificate and key, as stored in a Secret. Its errors say
// which part is wrong and never include key material, so they can go into conditions and events.
func ParseCA(certPEM, keyPEM []byte) (CA, error) {
	certs, err := certificates(certPEM)
	if err != nil {
		return CA{}, fmt.Errorf("CA certificate: %w", err)
	}
	cert := certs[0]
	if !cert.IsCA || !cert.BasicConstraintsValid {
		return CA{}, fmt.Errorf("CA certificate %q is not a CA certificate", cert.Subject.CommonName)
	}
	public, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return CA{}, fmt.Errorf("CA certificate %q has a %T, want an ECDSA key", cert.Subject.CommonName, cert.PublicKey)
	}
	key, err := parseECDSAKey(keyPEM)
	if err != nil {
		return CA{}, fmt.Errorf("CA key: %w", err)
	}
	if !public.Equal(key.Public()) {
		return CA{}, fmt.Errorf("CA key does not match the public key of CA certificate %q", cert.Subject.CommonName)
	}
	return CA{Cert: cert, Key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// CheckCA is ParseCA's error alone, remembered for the bytes asked about.
func CheckCA(certPEM, keyPEM []byte) error {
	key := digest("ca", certPEM, keyPEM)
	if err, ok := caChecked.get(key); ok {
		return err
	}
	_, err := ParseCA(certPEM, keyPEM)
	err = remembered(err)
	caChecked.put(key, err)
	return err
}

// Leaf is an issued certificate and key, PEM-encoded.
type Leaf struct{ CertPEM, KeyPEM []byte }

// Issue signs a new ECDSA P-256 leaf for usage whose common name is names[0] and whose SANs are
// names: IP addresses among them (e.g. "127.0.0.1") go into IPAddresses, the rest into DNSNames.
// It is valid from now-1h (clock skew) until now+validity, but never beyond the CA's NotAfter: a
// leaf outliving its CA would fail to verify anyway, and its renewal time would come too late.
func (ca CA) Issue(usage Usage, names []string, now time.Time, validity time.Duration) (Leaf, error) {
	extKeyUsages, err := usage.extKeyUsages()
	if err != nil {
		return Leaf{}, err
	}
	if ca.Cert == nil || ca.Key == nil {
		return Leaf{}, errors.New("the CA has no certificate or no key")
	}
	if len(names) == 0 {
		return Leaf{}, fmt.Errorf("a %s certificate needs at least one name", usage.name())
	}
	if validity <= 0 {
		return Leaf{}, fmt.Errorf("certificate validity %s is not positive", validity)
	}
	if !now.Before(ca.Cert.NotAfter) {
		return Leaf{}, fmt.Errorf("CA %q expired at %s", ca.Cert.Subject.CommonName, timestamp(ca.Cert.NotAfter))
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	template := &x509.Certificate{
		Subject:               pkix.Name{CommonName: names[0]},
		NotBefore:             now.Add(-ClockSkew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           extKeyUsages,
		BasicConstraintsValid: true,
	}
	for _, name := range names {
		switch ip := net.ParseIP(name); {
		case name == "":
			return Leaf{}, fmt.Errorf("a %s certificate for %q has an empty name", usage.name(), names)
		case ip != nil:
			template.IPAddresses = append(template.IPAddresses, ip)
		default:
			template.DNSNames = append(template.DNSNames, name)
		}
	}
	issued, err := create(template, ca.Cert, ca.Key)
	if err != nil {
		return Leaf{}, fmt.Errorf("%s certificate %q: %w", usage.name(), names[0], err)
	}
	return Leaf{CertPEM: issued.certPEM, KeyPEM: issued.keyPEM}, nil
}

// Expiry returns NotBefore and NotAfter of the first certificate in certPEM.
func Expiry(certPEM []byte) (notBefore, notAfter time.Time, err error) {
	key := digest("expiry", certPEM)
	v, ok := expiries.get(key)
	if !ok {
		var certs []*x509.Certificate
		if certs, v.err = certificates(certPEM); v.err == nil {
			v.notBefore, v.notAfter = certs[0].NotBefore, certs[0].NotAfter
		}
		v.err = remembered(v.err)
		expiries.put(key, v)
	}
	return v.notBefore, v.notAfter, v.err
}

// RenewAt is when a certificate is renewed: two thirds into its lifetime, so a renewal failing for
// a while still leaves a third of it. A certificate without a lifetime is renewed at notBefore.
func RenewAt(notBefore, notAfter time.Time) time.Time {
	if !notAfter.After(notBefore) {
		return notBefore
	}
	// notAfter - lifetime/3 rather than notBefore + lifetime*2/3, which could overflow.
	return notAfter.Add(-notAfter.Sub(notBefore) / 3)
}

// Check verifies that the leaf certificate in certPEM (followed by any intermediates) fits a
// cluster: keyPEM is its key, it is valid at now, it is for usage, it chains to a CA in caPEM, and
// it covers every name in names. Its error names the first problem, in that order. Checks follow
// what Go's TLS, and so etcd, accepts: a certificate without extended key usages is good for any.
// Used to tell whether issued or user-given Secrets fit the cluster, so keys need not be ECDSA.
//
// The answer is remembered for the bytes asked about and given again at any time in which every
// certificate read (leaf, intermediates, CAs) is valid: there, the time changes nothing. A CA
// bundle holding an expired CA leaves no such time, and the answer is worked out at each ask.
func Check(certPEM, keyPEM, caPEM []byte, usage Usage, names []string, now time.Time) error {
	inputs := [][]byte{certPEM, keyPEM, caPEM, binary.BigEndian.AppendUint64(nil, uint64(usage))}
	for _, name := range names {
		inputs = append(inputs, []byte(name))
	}
	key := digest("check", inputs...)
	if v, ok := checked.get(key); ok && v.in.holds(now) {
		return v.err
	}
	in, err := check(certPEM, keyPEM, caPEM, usage, names, now)
	err = remembered(err)
	if in.holds(now) {
		checked.put(key, verdict{err: err, in: in})
	}
	return err
}

// check is Check, also returning the window in which its answer holds: narrowed to each
// certificate's validity as it is read, so an answer given early depends on no time.
func check(certPEM, keyPEM, caPEM []byte, usage Usage, names []string, now time.Time) (window, error) {
	var in window
	extKeyUsages, err := usage.extKeyUsages()
	if err != nil {
		return in, err
	}
	chain, err := certificates(certPEM)
	if err != nil {
		return in, fmt.Errorf("certificate: %w", err)
	}
	for _, c := range chain {
		in = in.narrow(c.NotBefore, c.NotAfter)
	}
	leaf := chain[0]
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return in, fmt.Errorf("key of certificate %q: %w", leaf.Subject.CommonName, err)
	}
	authorities, err := certificates(caPEM)
	if err != nil {
		return in, fmt.Errorf("CA certificate: %w", err)
	}
	for _, c := range authorities {
		in = in.narrow(c.NotBefore, c.NotAfter)
	}
	if now.Before(leaf.NotBefore) {
		return in, fmt.Errorf("certificate %q is not valid before %s", leaf.Subject.CommonName, timestamp(leaf.NotBefore))
	}
	if now.After(leaf.NotAfter) {
		return in, fmt.Errorf("certificate %q expired at %s", leaf.Subject.CommonName, timestamp(leaf.NotAfter))
	}
	for _, want := range extKeyUsages {
		if !hasExtKeyUsage(leaf, want) {
			return in, fmt.Errorf("certificate %q is not for %s use: it lacks %s", leaf.Subject.CommonName, usage.name(), extKeyUsageName(want))
		}
	}
	options := x509.VerifyOptions{Roots: x509.NewCertPool(), Intermediates: x509.NewCertPool(), CurrentTime: now}
	for _, ca := range authorities {
		options.Roots.AddCert(ca)
	}
	for _, intermediate := range chain[1:] {
		options.Intermediates.AddCert(intermediate)
	}
	// One extended key usage at a time: VerifyOptions.KeyUsages accepts a chain allowing any of them.
	for _, want := range extKeyUsages {
		options.KeyUsages = []x509.ExtKeyUsage{want}
		if _, err := leaf.Verify(options); err != nil {
			return in, fmt.Errorf("certificate %q does not verify against the CA: %w", leaf.Subject.CommonName, err)
		}
	}
	for _, name := range names {
		if err := leaf.VerifyHostname(name); err != nil {
			return in, fmt.Errorf("certificate %q does not cover %q: %w", leaf.Subject.CommonName, name, err)
		}
	}
	return in, nil
}

// hasExtKeyUsage tells whether Go's certificate verification accepts cert for want.
func hasExtKeyUsage(cert *x509.Certificate, want x509.ExtKeyUsage) bool {
	if len(cert.ExtKeyUsage) == 0 && len(cert.UnknownExtKeyUsage) == 0 {
		return true
	}
	return slices.Contains(cert.ExtKeyUsage, want) || slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageAny)
}

// extKeyUsageName is the name of an extended key usage as RFC 5280 and openssl spell it.
func extKeyUsageName(usage x509.ExtKeyUsage) string {
	switch usage {
	case x509.ExtKeyUsageServerAuth:
		return "serverAuth"
	case x509.ExtKeyUsageClientAuth:
		return "clientAuth"
	}
	return fmt.Sprintf("extended key usage %d", int(usage))
}

// issued is a freshly signed certificate and its new key.
type issued struct {
	cert            *x509.Certificate
	key             *ecdsa.PrivateKey
	certPEM, keyPEM []byte
}

// serialLimit bounds serial numbers to 128 bits.
var serialLimit = new(big.Int).Lsh(big.NewInt(1), 128)

// create makes a new P-256 key and a certificate for it from template with a random 128-bit
// serial, signed by parent's key, or self-signed when parent is nil.
func create(template, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return issued{}, fmt.Errorf("generating key: %w", err)
	}
	// 1 to 2^128-1: RFC 5280 wants a positive serial.
	serial, err := rand.Int(rand.Reader, new(big.Int).Sub(serialLimit, big.NewInt(1)))
	if err != nil {
		return issued{}, fmt.Errorf("generating serial number: %w", err)
	}
	template.SerialNumber = serial.Add(serial, big.NewInt(1))
	if parent == nil {
		parent, parentKey = template, key
	}
	der, err := x509.CreateCertificate(rand.Reader, template, parent, key.Public(), parentKey)
	if err != nil {
		return issued{}, fmt.Errorf("signing: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return issued{}, fmt.Errorf("parsing the signed certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return issued{}, fmt.Errorf("encoding key: %w", err)
	}
	return issued{
		cert:    cert,
		key:     key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: certificateBlock, Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: pkcs8KeyBlock, Bytes: keyDER}),
	}, nil
}

// certificates parses every CERTIFICATE block in data, skipping blocks of other types, and fails
// when there is none.
func certificates(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if block.Type != certificateBlock {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(certs)+1, err)
		}
		certs = append(certs, cert)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("no %s PEM block", certificateBlock)
	}
	return certs, nil
}

// parseECDSAKey reads the first private key block in data, PKCS#8 or SEC 1, skipping others such as
// the "EC PARAMETERS" openssl writes ahead of a key. Parse errors are not wrapped: only the block
// type is named, so no part of a malformed key can reach a message.
func parseECDSAKey(data []byte) (*ecdsa.PrivateKey, error) {
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		switch block.Type {
		case ecKeyBlock:
			key, err := x509.ParseECPrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%q PEM block is not a valid EC private key", block.Type)
			}
			return key, nil
		case pkcs8KeyBlock:
			parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%q PEM block is not a valid PKCS#8 private key", block.Type)
			}
			key, ok := parsed.(*ecdsa.PrivateKey)
			if !ok {
				return nil, fmt.Errorf("%q PEM block holds a %T, want an ECDSA key", block.Type, parsed)
			}
			return key, nil
		}
	}
	return nil, fmt.Errorf("no %q or %q PEM block", pkcs8KeyBlock, ecKeyBlock)
}

// timestamp is t in error messages.
func timestamp(t time.Time) string {
	return t.UTC().Format(time.RFC3339)
}
