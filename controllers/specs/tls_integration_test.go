package specs_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
	"github.com/kvcluster/kvcluster-operator/controllers/certs"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// TestPeerPortTakesOnlyThePeerCertificate runs a real etcd with the peer flags a member of a
// cluster with the operator's certificates gets, on a loopback address no name of the
// certificates resolves to (as a member's pod address before its DNS record exists): the peer
// certificate is accepted at once, the client certificate that applications hold is not.
func TestPeerPortTakesOnlyThePeerCertificate(t *testing.T) {
	etcd := backuptest.RequireBinary(t, "KVC_ETCD_DIR", "etcd")
	kvc := &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: "kv", Namespace: "prod"},
		Spec: kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 3, TLS: &kvv1.TLSSpec{Mode: kvv1.TLSOperator}}}
	now := time.Now()
	ca, err := certs.NewCA("kv", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	issue := func(part string, usage certs.Usage, names []string) tls.Certificate {
		leaf, err := ca.Issue(usage, names, now, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		partDir := filepath.Join(dir, part)
		for file, data := range map[string][]byte{corev1.TLSCertKey: leaf.CertPEM, corev1.TLSPrivateKeyKey: leaf.KeyPEM, specs.CACertKey: ca.CertPEM} {
			if err := os.MkdirAll(partDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(partDir, file), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return pair
	}
	peerCert := issue(specs.TLSPeer, certs.Peer, specs.PeerNames(kvc))
	clientCert := issue(specs.TLSClient, certs.Client, []string{specs.ClientCommonName(kvc)})
	serverCert := issue(specs.TLSServer, certs.Server, specs.ServerNames(kvc))

	// The member's own peer flags, reading the certificates from here instead of its volumes.
	var peerFlags []string
	for _, arg := range specs.EtcdArgs(kvc, specs.DesiredTransport(kvc), 0) {
		if strings.HasPrefix(arg, "--peer-") {
			peerFlags = append(peerFlags, strings.ReplaceAll(arg, "/etc/etcd/tls", dir))
		}
	}
	if len(peerFlags) == 0 {
		t.Fatal("a member with TLS has no peer flags")
	}
	peer := fmt.Sprintf("https://127.0.0.1:%d", backuptest.FreePort(t))
	backuptest.StartEtcdOn(t, etcd, t.TempDir(), "kv-0", peer, peerFlags...)

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM)
	// connect asks the peer port for etcd's version, presenting cert, as a member dials a peer.
	connect := func(cert *tls.Certificate) error {
		cfg := &tls.Config{RootCAs: roots, ServerName: specs.PeerNames(kvc)[1]}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		resp, err := c.Get(peer + "/version")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", resp.Status, body)
		}
		return nil
	}
	if err := connect(&peerCert); err != nil {
		t.Errorf("a member's peer certificate, from an address its names do not resolve to: %v; want it accepted", err)
	}
	for name, cert := range map[string]*tls.Certificate{"the client certificate": &clientCert, "the server certificate": &serverCert, "no certificate": nil} {
		if err := connect(cert); err == nil {
			t.Errorf("%s opened a peer connection; want it refused", name)
		}
	}
}
