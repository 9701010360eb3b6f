package certs

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
)

// TestClientConfigsResumeSessions: a cluster's connections made again, with a configuration made
// again of the same inputs, resume the session kept with the member (RequireAndVerifyClientCert,
// as etcd with --client-cert-auth); new inputs (a renewed certificate, another CA bundle) start
// with sessions of their own, as another cluster does; bad inputs fail and keep nothing.
func TestClientConfigsResumeSessions(t *testing.T) {
	ca := liveCA(t, "kvcluster-ca")
	client, renewed := liveLeaf(t, ca, Client, "operator"), liveLeaf(t, ca, Client, "operator")
	trusted := x509.NewCertPool()
	trusted.AddCert(ca.Cert)
	member := liveLeaf(t, ca, Server, "127.0.0.1")
	addr := serveMembers(t, &tls.Config{Certificates: []tls.Certificate{keyPair(t, member)},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: trusted, MinVersion: tls.VersionTLS12})
	// connect makes one connection as the operator does, and reports whether it resumed a session.
	connect := func(config *tls.Config) bool {
		t.Helper()
		return dialMember(t, addr, config)
	}

	var configs ClientConfigs[string]
	// of is owner's configuration for the inputs, as a reconcile asks for it, knowing the
	// certificate the member serves.
	of := func(owner string, caPEM []byte, leaf Leaf) *tls.Config {
		t.Helper()
		config, err := configs.Of(owner, caPEM, leaf.CertPEM, leaf.KeyPEM, member.CertPEM)
		if err != nil {
			t.Fatal(err)
		}
		return config
	}
	if connect(of("ns/kv", ca.CertPEM, client)) {
		t.Fatal("the first connection resumed a session")
	}
	if !connect(of("ns/kv", ca.CertPEM, client)) {
		t.Error("a connection made again with the same inputs did not resume the session kept")
	}
	if connect(of("ns/other", ca.CertPEM, client)) {
		t.Error("another cluster resumed this cluster's session")
	}
	// A look that knows another member certificate (its Secret renewed, the member not serving the
	// new one yet) cannot put the served one back into the session: it connects anew, and keeps
	// that session whole.
	renewedMember := liveLeaf(t, ca, Server, "127.0.0.1")
	config, err := configs.Of("ns/kv", ca.CertPEM, client.CertPEM, client.KeyPEM, renewedMember.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	if connect(config) {
		t.Error("a session was resumed with a member certificate the look does not know")
	}
	if !connect(config) {
		t.Error("the session had with a member certificate the look does not know was not resumed")
	}
	if connect(of("ns/kv", ca.CertPEM, renewed)) {
		t.Error("a renewed certificate resumed the session of the one before")
	}
	otherCA := liveCA(t, "kvcluster-ca") // a rotation: the same client certificate, another CA trusted
	if connect(of("ns/kv", append(append([]byte{}, ca.CertPEM...), otherCA.CertPEM...), renewed)) {
		t.Error("a new CA bundle resumed a session of the configuration that trusts the old one only")
	}
	configs.Forget("ns/kv")
	if connect(of("ns/kv", ca.CertPEM, renewed)) {
		t.Error("a session was resumed after Forget")
	}
	if _, err := configs.Of("ns/kv", ca.CertPEM, client.CertPEM, renewed.KeyPEM, member.CertPEM); err == nil {
		t.Error("a certificate with another's key was taken")
	}
	if _, err := configs.Of("ns/other", []byte("garbage"), client.CertPEM, client.KeyPEM, member.CertPEM); err == nil {
		t.Error("a CA certificate of garbage was taken")
	}
	if n := len(configs.byOwner); n != 0 {
		t.Errorf("%d configurations kept after their owners' inputs failed, want 0", n)
	}
}

// BenchmarkClientConfig is making a cluster's client configuration from its Secret's bytes, as
// the operator does at each look at a TLS cluster (ClientConfigs.Of keeps only the sessions).
//
//	go test -run '^$' -bench 'ClientConfig$' ./controllers/certs/
func BenchmarkClientConfig(b *testing.B) {
	ca := liveCA(b, "kvcluster-ca")
	client := liveLeaf(b, ca, Client, "operator")
	for b.Loop() {
		if _, err := ClientConfig(ca.CertPEM, client.CertPEM, client.KeyPEM); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKeptClientTLS reports the heap ClientConfigs holds for a cluster once a configuration
// of it connected to a member and kept the session offered (what the operator keeps per cluster
// between looks, for one member; the look knows the certificate the member serves, from its
// Secret): each cluster has a CA and a member certificate of its own; the
// member asks for the client's certificate (RequireAndVerifyClientCert, as etcd with
// --client-cert-auth), here all issued by one CA the member trusts.
//
//	go test -run '^$' -bench KeptClientTLS ./controllers/certs/
func BenchmarkKeptClientTLS(b *testing.B) {
	clientCA := liveCA(b, "clients")
	client := liveLeaf(b, clientCA, Client, "operator")
	trusted := x509.NewCertPool()
	trusted.AddCert(clientCA.Cert)
	var mu sync.Mutex
	members := map[string]*tls.Certificate{} // by server name
	// One listener stands for every cluster's member: it presents the certificate of the one asked
	// for.
	addr := serveMembers(b, &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: trusted,
		MinVersion: tls.VersionTLS12, GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			mu.Lock()
			defer mu.Unlock()
			if cert, ok := members[hello.ServerName]; ok {
				return cert, nil
			}
			return nil, fmt.Errorf("no member %q", hello.ServerName)
		}})
	var configs ClientConfigs[int]
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	n := 0
	for b.Loop() {
		ca := liveCA(b, "kvcluster-ca")
		name := fmt.Sprintf("member-%d", n)
		memberLeaf := liveLeaf(b, ca, Server, name)
		memberCert := keyPair(b, memberLeaf)
		mu.Lock()
		members[name] = &memberCert
		mu.Unlock()

		config, err := configs.Of(n, ca.CertPEM, client.CertPEM, client.KeyPEM, memberLeaf.CertPEM)
		if err != nil {
			b.Fatal(err)
		}
		dial := config.Clone() // as gRPC does, naming the member; the sessions are the cluster's
		dial.ServerName = name
		dialMember(b, addr, dial)
		n++
	}
	mu.Lock()
	members = nil // the members' heap is not measured
	mu.Unlock()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(&configs) // what is measured is what it keeps
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "heap-B/cluster")
}

// dialMember makes one connection to the member at addr with config, reads the byte it sends after
// the handshake (so taking in its session ticket), and reports whether the connection resumed a
// session.
func dialMember(tb testing.TB, addr string, config *tls.Config) bool {
	tb.Helper()
	conn, err := tls.Dial("tcp", addr, config)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.ReadFull(conn, make([]byte, 1)); err != nil {
		tb.Fatal(err)
	}
	return conn.ConnectionState().DidResume
}

// serveMembers listens on loopback as members do with config, sending a byte after each handshake
// (and so after its session ticket) until the test ends, and returns its address.
func serveMembers(tb testing.TB, config *tls.Config) string {
	listener, err := tls.Listen("tcp", "127.0.0.1:0", config)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { listener.Close() })
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				conn.Write([]byte("k"))
				io.Copy(io.Discard, conn)
			}()
		}
	}()
	return listener.Addr().String()
}
