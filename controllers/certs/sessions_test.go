package certs

import (
	"crypto/tls"
	"crypto/x509"
	"io"
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
	conn, err := tls.Dial("tcp", serveMembers(t, &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}),
		&tls.Config{RootCAs: roots, ServerName: "127.0.0.1", ClientSessionCache: kept, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.ReadFull(conn, make([]byte, 1)); err != nil { // reading takes in the ticket
		t.Fatal(err)
	}
	session, ok := kept.Get("127.0.0.1")
	if !ok {
		t.Fatal("the member offered no session")
	}
	return session
}
