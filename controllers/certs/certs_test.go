package certs

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// now is the pinned time at which the tests issue and check certificates.
var now = time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)

const (
	day  = 24 * time.Hour
	year = 365 * day
)

func newCA(t *testing.T, commonName string, validity time.Duration) CA {
	t.Helper()
	ca, err := NewCA(commonName, now, validity)
	if err != nil {
		t.Fatalf("NewCA(%q): %v", commonName, err)
	}
	return ca
}

func issue(t *testing.T, ca CA, usage Usage, names ...string) Leaf {
	t.Helper()
	leaf, err := ca.Issue(usage, names, now, 90*day)
	if err != nil {
		t.Fatalf("Issue(%s, %q): %v", usage.name(), names, err)
	}
	return leaf
}

// liveCA, liveLeaf and keyPair are for the tests that make TLS connections, which check
// certificates at the real time, not at now: a CA and a certificate valid from the moment they
// are made, and a certificate as a TLS listener presents it.
func liveCA(tb testing.TB, commonName string) CA {
	tb.Helper()
	ca, err := NewCA(commonName, time.Now(), year)
	if err != nil {
		tb.Fatalf("NewCA(%q): %v", commonName, err)
	}
	return ca
}

func liveLeaf(tb testing.TB, ca CA, usage Usage, names ...string) Leaf {
	tb.Helper()
	leaf, err := ca.Issue(usage, names, time.Now(), 90*day)
	if err != nil {
		tb.Fatalf("Issue(%s, %q): %v", usage.name(), names, err)
	}
	return leaf
}

func keyPair(tb testing.TB, leaf Leaf) tls.Certificate {
	tb.Helper()
	pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	return pair
}

func parseLeaf(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	certs, err := certificates(certPEM)
	if err != nil {
		t.Fatalf("parsing the issued certificate: %v", err)
	}
	return certs[0]
}

func encodePEM(blockType string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
}

// wantError fails t unless err is nil when want is empty, or else contains want.
func wantError(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("error = %v, want none", err)
	case want != "" && err == nil:
		t.Fatalf("error = nil, want one containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error = %v, want one containing %q", err, want)
	}
}

func TestNewCA(t *testing.T) {
	ca := newCA(t, "kvcluster-ca", 10*year)
	cert := ca.Cert
	if cert.Subject.CommonName != "kvcluster-ca" {
		t.Errorf("CommonName = %q, want kvcluster-ca", cert.Subject.CommonName)
	}
	if !cert.IsCA || !cert.BasicConstraintsValid || !cert.MaxPathLenZero || cert.MaxPathLen != 0 {
		t.Errorf("IsCA %v, BasicConstraintsValid %v, MaxPathLenZero %v, MaxPathLen %d: want a CA that signs leaves only",
			cert.IsCA, cert.BasicConstraintsValid, cert.MaxPathLenZero, cert.MaxPathLen)
	}
	if want := x509.KeyUsageCertSign | x509.KeyUsageCRLSign; cert.KeyUsage != want {
		t.Errorf("KeyUsage = %b, want %b", cert.KeyUsage, want)
	}
	if want := now.Add(-time.Hour); !cert.NotBefore.Equal(want) {
		t.Errorf("NotBefore = %s, want %s", cert.NotBefore, want)
	}
	if want := now.Add(10 * year); !cert.NotAfter.Equal(want) {
		t.Errorf("NotAfter = %s, want %s", cert.NotAfter, want)
	}
	if err := cert.CheckSignatureFrom(cert); err != nil {
		t.Errorf("the CA is not self-signed: %v", err)
	}
	if ca.Key.Curve != elliptic.P256() {
		t.Errorf("curve = %s, want P-256", ca.Key.Curve.Params().Name)
	}
	if block, _ := pem.Decode(ca.KeyPEM); block == nil || block.Type != "PRIVATE KEY" {
		t.Errorf("KeyPEM is not a PKCS#8 PRIVATE KEY block")
	}
}

func TestParseCARoundTrip(t *testing.T) {
	ca := newCA(t, "kvcluster-ca", 10*year)
	sec1, err := x509.MarshalECPrivateKey(ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	params := encodePEM("EC PARAMETERS", []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07})
	tests := []struct {
		name   string
		keyPEM []byte
	}{
		{name: "PKCS#8 as NewCA writes it", keyPEM: ca.KeyPEM},
		{name: "SEC 1 EC PRIVATE KEY", keyPEM: encodePEM("EC PRIVATE KEY", sec1)},
		{name: "EC PARAMETERS ahead of the key, as openssl ecparam -genkey writes", keyPEM: append(params, encodePEM("EC PRIVATE KEY", sec1)...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parsed, err := ParseCA(ca.CertPEM, tt.keyPEM)
			if err != nil {
				t.Fatalf("ParseCA: %v", err)
			}
			if !parsed.Cert.Equal(ca.Cert) || !parsed.Key.Equal(ca.Key) {
				t.Fatalf("ParseCA returned another certificate or key than NewCA made")
			}
			leaf := issue(t, parsed, Server, "localhost")
			if err := Check(leaf.CertPEM, leaf.KeyPEM, ca.CertPEM, Server, []string{"localhost"}, now); err != nil {
				t.Fatalf("a leaf issued by the parsed CA does not check against the original: %v", err)
			}
		})
	}
}

func TestParseCARejects(t *testing.T) {
	ca := newCA(t, "kvcluster-ca", 10*year)
	other := newCA(t, "other-ca", 10*year)
	leaf := issue(t, ca, Client, "operator")
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	edDER, err := x509.MarshalPKCS8PrivateKey(edKey)
	if err != nil {
		t.Fatal(err)
	}
	// Garbage inside a valid-looking block, which a parser might quote back.
	garbageDER := []byte("0123456789abcdef0123456789abcdef0123456789abcdef")
	tests := []struct {
		name    string
		certPEM []byte
		keyPEM  []byte
		wantErr string
	}{
		{name: "certificate is not PEM", certPEM: []byte("not PEM"), keyPEM: ca.KeyPEM, wantErr: "CA certificate: no CERTIFICATE PEM block"},
		{name: "certificate block holds garbage", certPEM: encodePEM("CERTIFICATE", garbageDER), keyPEM: ca.KeyPEM, wantErr: "CA certificate: certificate 1:"},
		{name: "certificate is a leaf", certPEM: leaf.CertPEM, keyPEM: leaf.KeyPEM, wantErr: `"operator" is not a CA certificate`},
		{name: "key is not PEM", certPEM: ca.CertPEM, keyPEM: []byte("not PEM"), wantErr: `CA key: no "PRIVATE KEY" or "EC PRIVATE KEY" PEM block`},
		{name: "key is a certificate", certPEM: ca.CertPEM, keyPEM: ca.CertPEM, wantErr: `CA key: no "PRIVATE KEY"`},
		{name: "PKCS#8 block holds garbage", certPEM: ca.CertPEM, keyPEM: encodePEM("PRIVATE KEY", garbageDER), wantErr: "not a valid PKCS#8 private key"},
		{name: "EC block holds garbage", certPEM: ca.CertPEM, keyPEM: encodePEM("EC PRIVATE KEY", garbageDER), wantErr: "not a valid EC private key"},
		{name: "key is not ECDSA", certPEM: ca.CertPEM, keyPEM: encodePEM("PRIVATE KEY", edDER), wantErr: "want an ECDSA key"},
		{name: "key of another CA", certPEM: ca.CertPEM, keyPEM: other.KeyPEM, wantErr: `CA key does not match the public key of CA certificate "kvcluster-ca"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCA(tt.certPEM, tt.keyPEM)
			wantError(t, err, tt.wantErr)
			for _, secret := range []string{string(garbageDER), "0123456789abcdef", string(tt.keyPEM)} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("error %q quotes key material", err)
				}
			}
		})
	}
}

func TestIssueExtKeyUsage(t *testing.T) {
	ca := newCA(t, "kvcluster-ca", 10*year)
	tests := []struct {
		name  string
		usage Usage
		want  []x509.ExtKeyUsage
	}{
		{name: "server", usage: Server, want: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}},
		{name: "peer", usage: Peer, want: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}},
		{name: "client", usage: Client, want: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			leaf := issue(t, ca, tt.usage, "member-0")
			cert := parseLeaf(t, leaf.CertPEM)
			if !slices.Equal(cert.ExtKeyUsage, tt.want) {
				t.Errorf("ExtKeyUsage = %v, want %v", cert.ExtKeyUsage, tt.want)
			}
			if cert.KeyUsage != x509.KeyUsageDigitalSignature {
				t.Errorf("KeyUsage = %b, want DigitalSignature only", cert.KeyUsage)
			}
			if cert.IsCA {
				t.Errorf("a leaf is a CA")
			}
			if cert.SerialNumber.Sign() <= 0 || cert.SerialNumber.BitLen() > 128 {
				t.Errorf("serial %s is not a positive 128-bit number", cert.SerialNumber)
			}
			if err := cert.CheckSignatureFrom(ca.Cert); err != nil {
				t.Errorf("not signed by the CA: %v", err)
			}
			if key, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || key.Curve != elliptic.P256() {
				t.Errorf("public key is a %T, want ECDSA P-256", cert.PublicKey)
			}
			if block, _ := pem.Decode(leaf.KeyPEM); block == nil || block.Type != "PRIVATE KEY" {
				t.Errorf("KeyPEM is not a PKCS#8 PRIVATE KEY block")
			}
			if _, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM); err != nil {
				t.Errorf("certificate and key do not pair: %v", err)
			}
		})
	}
}

func TestIssueSubjectAltNames(t *testing.T) {
	ca := newCA(t, "kvcluster-ca", 10*year)
	tests := []struct {
		name    string
		names   []string
		wantCN  string
		wantDNS []string
		wantIPs []string
	}{
		{
			name:    "member names and loopback addresses",
			names:   []string{"kv-0.kv.ns.svc", "kv-0", "localhost", "127.0.0.1", "::1"},
			wantCN:  "kv-0.kv.ns.svc",
			wantDNS: []string{"kv-0.kv.ns.svc", "kv-0", "localhost"},
			wantIPs: []string{"127.0.0.1", "::1"},
		},
		{name: "an address first is the common name", names: []string{"10.0.0.7", "kv.ns.svc"}, wantCN: "10.0.0.7", wantDNS: []string{"kv.ns.svc"}, wantIPs: []string{"10.0.0.7"}},
		{name: "a wildcard for all members", names: []string{"*.kv.ns.svc"}, wantCN: "*.kv.ns.svc", wantDNS: []string{"*.kv.ns.svc"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cert := parseLeaf(t, issue(t, ca, Peer, tt.names...).CertPEM)
			var ips []string
			for _, ip := range cert.IPAddresses {
				ips = append(ips, ip.String())
			}
			if cert.Subject.CommonName != tt.wantCN || !slices.Equal(cert.DNSNames, tt.wantDNS) || !slices.Equal(ips, tt.wantIPs) {
				t.Errorf("CommonName %q, DNSNames %q, IPAddresses %q; want %q, %q, %q",
					cert.Subject.CommonName, cert.DNSNames, ips, tt.wantCN, tt.wantDNS, tt.wantIPs)
			}
		})
	}
}

func TestIssueValidity(t *testing.T) {
	ca := newCA(t, "kvcluster-ca", year) // valid from now-1h until now+1y
	tests := []struct {
		name          string
		issueAt       time.Time
		validity      time.Duration
		wantNotBefore time.Time
		wantNotAfter  time.Time
	}{
		{name: "within the CA's life", issueAt: now, validity: 90 * day, wantNotBefore: now.Add(-time.Hour), wantNotAfter: now.Add(90 * day)},
		{name: "longer than the CA: clamped", issueAt: now, validity: 2 * year, wantNotBefore: now.Add(-time.Hour), wantNotAfter: now.Add(year)},
		{name: "late in the CA's life: clamped", issueAt: now.Add(300 * day), validity: 90 * day, wantNotBefore: now.Add(300*day - time.Hour), wantNotAfter: now.Add(year)},
		{name: "ending with the CA", issueAt: now.Add(year - 90*day), validity: 90 * day, wantNotBefore: now.Add(year - 90*day - time.Hour), wantNotAfter: now.Add(year)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			leaf, err := ca.Issue(Server, []string{"kv-0"}, tt.issueAt, tt.validity)
			if err != nil {
				t.Fatalf("Issue: %v", err)
			}
			cert := parseLeaf(t, leaf.CertPEM)
			if !cert.NotBefore.Equal(tt.wantNotBefore) || !cert.NotAfter.Equal(tt.wantNotAfter) {
				t.Errorf("valid %s to %s, want %s to %s", cert.NotBefore, cert.NotAfter, tt.wantNotBefore, tt.wantNotAfter)
			}
			if cert.NotAfter.After(ca.Cert.NotAfter) {
				t.Errorf("the leaf ends %s, after its CA (%s)", cert.NotAfter, ca.Cert.NotAfter)
			}
		})
	}
}

func TestIssueRejects(t *testing.T) {
	ca := newCA(t, "kvcluster-ca", year)
	tests := []struct {
		name     string
		ca       CA
		usage    Usage
		names    []string
		issueAt  time.Time
		validity time.Duration
		wantErr  string
	}{
		{name: "no usage", ca: ca, usage: 0, names: []string{"kv-0"}, issueAt: now, validity: day, wantErr: "unknown certificate usage 0"},
		{name: "unknown usage", ca: ca, usage: Client + 1, names: []string{"kv-0"}, issueAt: now, validity: day, wantErr: "unknown certificate usage 4"},
		{name: "no names", ca: ca, usage: Server, issueAt: now, validity: day, wantErr: "needs at least one name"},
		{name: "an empty name", ca: ca, usage: Server, names: []string{"kv-0", ""}, issueAt: now, validity: day, wantErr: "has an empty name"},
		{name: "no validity", ca: ca, usage: Server, names: []string{"kv-0"}, issueAt: now, validity: 0, wantErr: "validity 0s is not positive"},
		{name: "CA expired", ca: ca, usage: Server, names: []string{"kv-0"}, issueAt: now.Add(year), validity: day, wantErr: `CA "kvcluster-ca" expired at 2027-03-01T12:00:00Z`},
		{name: "no CA", ca: CA{}, usage: Server, names: []string{"kv-0"}, issueAt: now, validity: day, wantErr: "no certificate or no key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.ca.Issue(tt.usage, tt.names, tt.issueAt, tt.validity)
			wantError(t, err, tt.wantErr)
		})
	}
}

func TestNewCARejects(t *testing.T) {
	tests := []struct {
		name       string
		commonName string
		validity   time.Duration
		wantErr    string
	}{
		{name: "no common name", commonName: "", validity: year, wantErr: "needs a common name"},
		{name: "negative validity", commonName: "kvcluster-ca", validity: -time.Hour, wantErr: "validity -1h0m0s is not positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewCA(tt.commonName, now, tt.validity)
			wantError(t, err, tt.wantErr)
		})
	}
}

func TestExpiry(t *testing.T) {
	ca := newCA(t, "kvcluster-ca", year)
	leaf := issue(t, ca, Client, "backup")
	tests := []struct {
		name          string
		certPEM       []byte
		wantNotBefore time.Time
		wantNotAfter  time.Time
		wantErr       string
	}{
		{name: "a leaf", certPEM: leaf.CertPEM, wantNotBefore: now.Add(-time.Hour), wantNotAfter: now.Add(90 * day)},
		{name: "the first of a bundle", certPEM: append(slices.Clone(leaf.CertPEM), ca.CertPEM...), wantNotBefore: now.Add(-time.Hour), wantNotAfter: now.Add(90 * day)},
		{name: "the certificate after a key", certPEM: append(slices.Clone(leaf.KeyPEM), ca.CertPEM...), wantNotBefore: now.Add(-time.Hour), wantNotAfter: now.Add(year)},
		{name: "garbage", certPEM: []byte("garbage"), wantErr: "no CERTIFICATE PEM block"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			notBefore, notAfter, err := Expiry(tt.certPEM)
			wantError(t, err, tt.wantErr)
			if !notBefore.Equal(tt.wantNotBefore) || !notAfter.Equal(tt.wantNotAfter) {
				t.Errorf("Expiry = %s, %s; want %s, %s", notBefore, notAfter, tt.wantNotBefore, tt.wantNotAfter)
			}
		})
	}
}

func TestRenewAt(t *testing.T) {
	tests := []struct {
		name      string
		notBefore time.Time
		notAfter  time.Time
		want      time.Time
	}{
		{name: "90 days", notBefore: now, notAfter: now.Add(90 * day), want: now.Add(60 * day)},
		{name: "backdated leaf of 90 days and an hour", notBefore: now.Add(-time.Hour), notAfter: now.Add(90 * day), want: now.Add(60*day - 20*time.Minute)},
		{name: "3 hours", notBefore: now, notAfter: now.Add(3 * time.Hour), want: now.Add(2 * time.Hour)},
		{name: "a thousand years, past what a Duration holds", notBefore: now, notAfter: now.AddDate(1000, 0, 0), want: now.AddDate(1000, 0, 0).Add(-(1<<63 - 1) / 3)},
		{name: "no lifetime", notBefore: now, notAfter: now, want: now},
		{name: "ends before it begins", notBefore: now, notAfter: now.Add(-day), want: now},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RenewAt(tt.notBefore, tt.notAfter); !got.Equal(tt.want) {
				t.Errorf("RenewAt = %s, want %s", got, tt.want)
			}
		})
	}
}

// leafWithoutExtKeyUsage is a leaf as some tools make it: without extended key usages, which Go's
// TLS accepts for any use.
func leafWithoutExtKeyUsage(t *testing.T, ca CA, name string) Leaf {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(7),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(day),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Leaf{CertPEM: encodePEM("CERTIFICATE", der), KeyPEM: encodePEM("EC PRIVATE KEY", keyDER)}
}

func TestCheck(t *testing.T) {
	ca := newCA(t, "kvcluster-ca", 10*year)
	other := newCA(t, "other-ca", 10*year)
	memberNames := []string{"kv-0.kv.ns.svc", "kv-0", "127.0.0.1"}
	server := issue(t, ca, Server, memberNames...)
	peer := issue(t, ca, Peer, "*.kv.ns.svc")
	client := issue(t, ca, Client, "operator")
	foreign := issue(t, other, Server, memberNames...)
	bare := leafWithoutExtKeyUsage(t, ca, "kv-0")
	tests := []struct {
		name    string
		leaf    Leaf
		caPEM   []byte
		usage   Usage
		names   []string
		at      time.Time
		wantErr string
	}{
		{name: "server", leaf: server, caPEM: ca.CertPEM, usage: Server, names: memberNames, at: now},
		{name: "peer with a wildcard", leaf: peer, caPEM: ca.CertPEM, usage: Peer, names: []string{"kv-0.kv.ns.svc", "kv-2.kv.ns.svc"}, at: now},
		{name: "peer as server", leaf: peer, caPEM: ca.CertPEM, usage: Server, names: []string{"kv-1.kv.ns.svc"}, at: now},
		{name: "client without names", leaf: client, caPEM: ca.CertPEM, usage: Client, at: now},
		{name: "server without names", leaf: server, caPEM: ca.CertPEM, usage: Server, at: now},
		{name: "an empty name is not no name", leaf: server, caPEM: ca.CertPEM, usage: Server, names: []string{""}, at: now, wantErr: `does not cover ""`},
		{name: "CA bundle during rotation", leaf: server, caPEM: append(slices.Clone(other.CertPEM), ca.CertPEM...), usage: Server, names: memberNames, at: now},
		{name: "at the last second", leaf: server, caPEM: ca.CertPEM, usage: Server, at: now.Add(90 * day)},
		{name: "no extended key usage is any", leaf: bare, caPEM: ca.CertPEM, usage: Peer, names: []string{"kv-0"}, at: now},
		{name: "name not covered", leaf: server, caPEM: ca.CertPEM, usage: Server, names: []string{"kv-0", "kv-1"}, at: now, wantErr: `certificate "kv-0.kv.ns.svc" does not cover "kv-1"`},
		{name: "address not covered", leaf: server, caPEM: ca.CertPEM, usage: Server, names: []string{"10.0.0.7"}, at: now, wantErr: `does not cover "10.0.0.7"`},
		{name: "wildcard covers one level only", leaf: peer, caPEM: ca.CertPEM, usage: Peer, names: []string{"kv.ns.svc"}, at: now, wantErr: `does not cover "kv.ns.svc"`},
		{name: "expired", leaf: server, caPEM: ca.CertPEM, usage: Server, at: now.Add(90*day + time.Second), wantErr: "expired at 2026-05-30T12:00:00Z"},
		{name: "not yet valid", leaf: server, caPEM: ca.CertPEM, usage: Server, at: now.Add(-2 * time.Hour), wantErr: "not valid before 2026-03-01T11:00:00Z"},
		{name: "client as server", leaf: client, caPEM: ca.CertPEM, usage: Server, at: now, wantErr: `certificate "operator" is not for server use: it lacks serverAuth`},
		{name: "server as peer", leaf: server, caPEM: ca.CertPEM, usage: Peer, at: now, wantErr: "is not for peer use: it lacks clientAuth"},
		{name: "server as client", leaf: server, caPEM: ca.CertPEM, usage: Client, at: now, wantErr: "is not for client use: it lacks clientAuth"},
		{name: "unknown usage", leaf: server, caPEM: ca.CertPEM, usage: 0, at: now, wantErr: "unknown certificate usage 0"},
		{name: "another CA", leaf: foreign, caPEM: ca.CertPEM, usage: Server, names: memberNames, at: now, wantErr: "signed by unknown authority"},
		{name: "mismatched key", leaf: Leaf{CertPEM: server.CertPEM, KeyPEM: peer.KeyPEM}, caPEM: ca.CertPEM, usage: Server, at: now, wantErr: "private key does not match public key"},
		{name: "garbage certificate", leaf: Leaf{CertPEM: []byte("garbage"), KeyPEM: server.KeyPEM}, caPEM: ca.CertPEM, usage: Server, at: now, wantErr: "certificate: no CERTIFICATE PEM block"},
		{name: "garbage key", leaf: Leaf{CertPEM: server.CertPEM, KeyPEM: []byte("garbage")}, caPEM: ca.CertPEM, usage: Server, at: now, wantErr: "key of certificate"},
		{name: "garbage CA", leaf: server, caPEM: []byte("garbage"), usage: Server, at: now, wantErr: "CA certificate: no CERTIFICATE PEM block"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(tt.leaf.CertPEM, tt.leaf.KeyPEM, tt.caPEM, tt.usage, tt.names, tt.at)
			wantError(t, err, tt.wantErr)
			// Asked again, the answer may come from memory: the same.
			wantError(t, Check(tt.leaf.CertPEM, tt.leaf.KeyPEM, tt.caPEM, tt.usage, tt.names, tt.at), tt.wantErr)
		})
	}
}

// TestCheckAnswersForTheTimeAsked: the same bytes asked about at different times, in this order,
// get each time's answer, though an answer is remembered (Check's memo).
func TestCheckAnswersForTheTimeAsked(t *testing.T) {
	ca := newCA(t, "kvcluster-ca", 10*year)
	server := issue(t, ca, Server, "kv-0")
	shortCA := newCA(t, "short-lived-ca", 12*time.Hour)         // expires at now+11h (backdated an hour)
	outlivesItsCA := leafWithoutExtKeyUsage(t, shortCA, "kv-0") // valid until now+1d
	asked := []struct {
		name    string
		leaf    Leaf
		caPEM   []byte
		at      time.Time
		wantErr string
	}{
		{name: "valid", leaf: server, caPEM: ca.CertPEM, at: now},
		{name: "then expired", leaf: server, caPEM: ca.CertPEM, at: now.Add(90*day + time.Second), wantErr: "expired at"},
		{name: "then not yet valid", leaf: server, caPEM: ca.CertPEM, at: now.Add(-2 * time.Hour), wantErr: "not valid before"},
		{name: "valid again", leaf: server, caPEM: ca.CertPEM, at: now.Add(time.Hour)},
		{name: "leaf and CA valid", leaf: outlivesItsCA, caPEM: shortCA.CertPEM, at: now},
		{name: "then the CA expired, the leaf still valid", leaf: outlivesItsCA, caPEM: shortCA.CertPEM, at: now.Add(12*time.Hour + time.Second), wantErr: "does not verify against the CA"},
		{name: "leaf and CA valid again", leaf: outlivesItsCA, caPEM: shortCA.CertPEM, at: now.Add(time.Hour)},
	}
	for _, a := range asked {
		t.Run(a.name, func(t *testing.T) {
			wantError(t, Check(a.leaf.CertPEM, a.leaf.KeyPEM, a.caPEM, Server, []string{"kv-0"}, a.at), a.wantErr)
		})
	}
}

// TestMemoKeepsWhatIsStillAskedFor: past its limit the memo turns over; an answer asked for since
// the last turnover stays, one not asked for in two turnovers goes, and no more than twice the
// limit are held.
func TestMemoKeepsWhatIsStillAskedFor(t *testing.T) {
	m := memo[string]{limit: 2}
	key := func(s string) [32]byte { return digest("test", []byte(s)) }
	has := func(s string) bool { _, ok := m.get(key(s)); return ok }
	m.put(key("a"), "a")
	m.put(key("b"), "b")
	m.put(key("c"), "c") // turnover: a and b older
	if v, ok := m.get(key("a")); !ok || v != "a" {
		t.Fatalf("a after one turnover: %q, %v; want it kept", v, ok)
	}
	m.put(key("d"), "d") // turnover: c and a older, b dropped
	if has("b") {
		t.Error("b, not asked for in two turnovers, is still held")
	}
	for _, s := range []string{"a", "c", "d"} {
		if !has(s) {
			t.Errorf("%s dropped, though asked for since the last turnover", s)
		}
	}
	if held := len(m.newer) + len(m.older); held > 2*m.limit {
		t.Errorf("%d answers held, want at most %d", held, 2*m.limit)
	}
}

// TestDigestSeparatesInputs: inputs that concatenate alike are different questions.
func TestDigestSeparatesInputs(t *testing.T) {
	if digest("q", []byte("ab"), []byte("c")) == digest("q", []byte("a"), []byte("bc")) {
		t.Error(`("ab", "c") and ("a", "bc") hash alike`)
	}
	if digest("expiry", []byte("x")) == digest("ca", []byte("x")) {
		t.Error("two questions about the same bytes hash alike")
	}
}

// TestMutualTLS checks with Go's TLS, which etcd uses, that the certificates work together: a
// server that requires client certificates from the CA accepts exactly the clients it should.
func TestMutualTLS(t *testing.T) {
	ca := newCA(t, "kvcluster-ca", 10*year)
	other := newCA(t, "other-ca", 10*year)
	serverLeaf := issue(t, ca, Server, "127.0.0.1", "localhost")
	serverCert, err := tls.X509KeyPair(serverLeaf.CertPEM, serverLeaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	clock := func() time.Time { return now } // both ends verify at the pinned time

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.TLS.PeerCertificates[0].Subject.CommonName)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // rejected handshakes are expected
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{serverCert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		Time:         clock,
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}

	clientLeaf := issue(t, ca, Client, "operator")
	peerLeaf := issue(t, ca, Peer, "kv-1")
	foreignLeaf := issue(t, other, Client, "operator")
	serverAsClient := issue(t, ca, Server, "kv-1")
	tests := []struct {
		name     string
		host     string // the server is dialled by this name
		client   *Leaf  // the client's certificate, if any
		wantErr  string
		wantPeer string // the client's name as the server saw it
	}{
		{name: "client leaf by address", host: "127.0.0.1", client: &clientLeaf, wantPeer: "operator"},
		{name: "client leaf by name", host: "localhost", client: &clientLeaf, wantPeer: "operator"},
		{name: "peer leaf as client", host: "127.0.0.1", client: &peerLeaf, wantPeer: "kv-1"},
		{name: "no client certificate", host: "127.0.0.1", wantErr: "tls: certificate required"},
		{name: "client leaf of another CA", host: "127.0.0.1", client: &foreignLeaf, wantErr: "tls: unknown certificate authority"},
		{name: "server leaf as client", host: "127.0.0.1", client: &serverAsClient, wantErr: "tls: bad certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			config := &tls.Config{RootCAs: pool, ServerName: tt.host, Time: clock}
			if tt.client != nil {
				cert, err := tls.X509KeyPair(tt.client.CertPEM, tt.client.KeyPEM)
				if err != nil {
					t.Fatal(err)
				}
				// Always sent: Go's client would keep back a certificate the server's CAs did not issue.
				config.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
			}
			transport := &http.Transport{TLSClientConfig: config}
			t.Cleanup(transport.CloseIdleConnections)
			response, err := (&http.Client{Transport: transport}).Get("https://" + net.JoinHostPort(tt.host, port))
			if err == nil {
				defer response.Body.Close()
			}
			wantError(t, err, tt.wantErr)
			if err != nil {
				return
			}
			body, err := io.ReadAll(response.Body)
			if err != nil {
				t.Fatal(err)
			}
			if string(body) != tt.wantPeer {
				t.Errorf("the server saw client %q, want %q", body, tt.wantPeer)
			}
		})
	}
}
