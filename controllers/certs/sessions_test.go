package certs

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"slices"
	"testing"
)

// TestCompactSessions: the cache gives back, parsed, each server's last session; a nil session
// forgets the server's; past its limit the session put longest ago goes.
func TestCompactSessions(t *testing.T) {
	session := oneSession(t)
	steps := []struct {
		put  string
		gone bool // put nil: forget it
		want []string
	}{
		{put: "a", want: []string{"a"}},
		{put: "b", want: []string{"a", "b"}},
		{put: "c", want: []string{"a", "b", "c"}},
		{put: "a", want: []string{"a", "b", "c"}}, // put again: now the newest
		{put: "d", want: []string{"a", "c", "d"}}, // b was put longest ago
		{put: "c", gone: true, want: []string{"a", "d"}},
		{put: "x", gone: true, want: []string{"a", "d"}},
		{put: "e", want: []string{"a", "d", "e"}},
		{put: "f", want: []string{"d", "e", "f"}}, // a was put longest ago
	}
	cache := newCompactSessions(3)
	for i, step := range steps {
		if step.gone {
			cache.Put(step.put, nil)
		} else {
			cache.Put(step.put, session)
		}
		var kept []string
		for _, key := range []string{"a", "b", "c", "d", "e", "f", "x"} {
			got, ok := cache.Get(key)
			if ok != (got != nil) {
				t.Fatalf("step %d: Get(%q) = %v, %v", i, key, got, ok)
			}
			if ok {
				kept = append(kept, key)
			}
		}
		if !slices.Equal(kept, step.want) {
			t.Errorf("step %d (put %q, nil %v): sessions of %v, want %v", i, step.put, step.gone, kept, step.want)
		}
	}
}

// oneSession returns the session a member offered a client on its first connection.
func oneSession(t *testing.T) *tls.ClientSessionState {
	t.Helper()
	ca := liveCA(t, "kvcluster-ca")
	serverCert := keyPair(t, liveLeaf(t, ca, Server, "127.0.0.1"))
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	kept := newCompactSessions(1)
	dialMember(t, serveMembers(t, &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}),
		&tls.Config{RootCAs: roots, ServerName: "127.0.0.1", ClientSessionCache: kept, MinVersion: tls.VersionTLS12})
	session, ok := kept.Get("127.0.0.1")
	if !ok {
		t.Fatal("the member offered no session")
	}
	return session
}

// TestKnownCertificatesTakenAndPutBack: the known certificates are taken out of a state wherever
// they are, and put back where they were; one the restoring look does not know leaves the state
// unusable.
func TestKnownCertificatesTakenAndPutBack(t *testing.T) {
	member, ca, other := []byte("MEMBER-CERTIFICATE"), []byte("CA-CERTIFICATE"), []byte("OTHER-CERTIFICATE")
	known := knownCertificates{sha256.Sum256(member): member, sha256.Sum256(ca): ca}
	cases := []struct {
		name     string
		state    string
		kept     string // what is kept of the state
		restored knownCertificates
		usable   bool
		// unknown: the look that kept the state knew no certificate.
		unknown bool
	}{
		{name: "none known in it", state: "head OTHER-CERTIFICATE tail", kept: "head OTHER-CERTIFICATE tail", restored: known, usable: true},
		{name: "member and chain", state: "head MEMBER-CERTIFICATE chain CA-CERTIFICATE tail", kept: "head  chain  tail", restored: known, usable: true},
		{name: "at both ends", state: "MEMBER-CERTIFICATEmiddleCA-CERTIFICATE", kept: "middle", restored: known, usable: true},
		{name: "twice", state: "a MEMBER-CERTIFICATE b MEMBER-CERTIFICATE c", kept: "a  b  c", restored: known, usable: true},
		{name: "side by side", state: "CA-CERTIFICATEMEMBER-CERTIFICATECA-CERTIFICATE", kept: "", restored: known, usable: true},
		{name: "restored by a look that knows another member certificate", state: "head MEMBER-CERTIFICATE chain CA-CERTIFICATE tail", kept: "head  chain  tail",
			restored: knownCertificates{sha256.Sum256(other): other, sha256.Sum256(ca): ca}},
		{name: "restored by a look that knows none", state: "head MEMBER-CERTIFICATE tail", kept: "head  tail"},
		{name: "kept by a look that knew none", state: "head MEMBER-CERTIFICATE tail", kept: "head MEMBER-CERTIFICATE tail", usable: true, unknown: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			taking := known
			if c.unknown {
				taking = nil
			}
			kept, taken := taking.take([]byte(c.state))
			if string(kept) != c.kept {
				t.Errorf("kept %q, want %q", kept, c.kept)
			}
			if cap(kept) != len(kept) {
				t.Errorf("kept %d bytes in %d", len(kept), cap(kept))
			}
			restored, ok := c.restored.restore(storedSession{state: kept, taken: taken})
			if ok != c.usable {
				t.Fatalf("restore usable = %v, want %v", ok, c.usable)
			}
			if ok && string(restored) != c.state {
				t.Errorf("restored %q, want %q", restored, c.state)
			}
		})
	}
}

// TestSessionsKeptWithoutTheMembersCertificates: a session a member offered is kept without its
// certificate and the CA's (the look knew both), put back as Go serialized it, and resumed.
func TestSessionsKeptWithoutTheMembersCertificates(t *testing.T) {
	ca := liveCA(t, "kvcluster-ca")
	member := liveLeaf(t, ca, Server, "127.0.0.1")
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	addr := serveMembers(t, &tls.Config{Certificates: []tls.Certificate{keyPair(t, member)}, MinVersion: tls.VersionTLS12})
	kept := newCompactSessions(1)
	look := lookSessions{kept: kept, known: certificatesIn(ca.CertPEM, member.CertPEM)}
	config := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", ClientSessionCache: look, MinVersion: tls.VersionTLS12}
	dialMember(t, addr, config)
	stored := kept.sessions["127.0.0.1"]
	if stored == nil {
		t.Fatal("the member offered no session")
	}
	session, ok := look.Get("127.0.0.1")
	if !ok {
		t.Fatal("the session kept did not parse with its certificates put back")
	}
	_, state, err := session.ResumptionState()
	if err != nil {
		t.Fatal(err)
	}
	serialized, err := state.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	restored, _ := look.known.restore(*stored)
	if !bytes.Equal(restored, serialized) {
		t.Error("the state put back differs from the state Go serializes for the session it parses to")
	}
	var certificates int
	for _, der := range look.known {
		certificates += len(der)
	}
	if len(stored.taken) != 2 || len(serialized)-len(stored.state) != certificates {
		t.Errorf("kept %d bytes of a %d-byte state, %d certificates taken out; want the member's and the CA's (%d bytes) taken out",
			len(stored.state), len(serialized), len(stored.taken), certificates)
	}
	if _, ok := kept.get("127.0.0.1", certificatesIn(ca.CertPEM)); ok {
		t.Error("a session was given out without the member's certificate known")
	}
	if !dialMember(t, addr, config) {
		t.Error("the session kept without its certificates was not resumed")
	}
}
