package membersim

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/certs"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// tlsMember is a ready member pod made from the operator's own StatefulSet for transport t, and
// the server certificate Secret it mounts, issued by ca.
func tlsMember(t *testing.T, kvc *kvv1.KVCluster, transport specs.Transport, ca certs.CA) (*corev1.Pod, *corev1.Secret) {
	t.Helper()
	sts := specs.StatefulSet(kvc, specs.MemberSet{Replicas: kvc.Spec.Partitions, Transport: transport})
	raw, err := json.Marshal(sts.Spec.Template.Spec)
	if err != nil {
		t.Fatal(err)
	}
	pod := memberPod(kvc, 0, "3.7.3", true)
	if err := json.Unmarshal(raw, &pod.Spec); err != nil {
		t.Fatal(err)
	}
	server, err := ca.Issue(certs.Server, specs.ServerNames(kvc), time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: kvc.Namespace, Name: specs.TLSSecretName(kvc, specs.TLSServer)},
		Data: map[string][]byte{corev1.TLSCertKey: server.CertPEM, corev1.TLSPrivateKeyKey: server.KeyPEM, specs.CACertKey: ca.CertPEM}}
	return pod, secret
}

// clientOf is the TLS configuration of a client trusting the CA trusted, with a certificate from issuer.
func clientOf(t *testing.T, trusted, issuer certs.CA) *tls.Config {
	t.Helper()
	leaf, err := issuer.Issue(certs.Client, []string{"kvcluster-operator"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	config, err := certs.ClientConfig(trusted.CertPEM, leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return config
}

// A member takes what its pod's flags say it listens on, as etcd does: TLS with the server
// certificate its pod mounts, a client certificate from the cluster's CA required; plaintext; or
// both on one port. The fleet benchmark's operator then pays for TLS as it does on real members.
func TestAMemberTakesTheSchemesItsPodListensOn(t *testing.T) {
	kvc := testCluster("kv", 1)
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	ca, err := certs.NewCA("kvcluster-ca.kv.ns", time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := certs.NewCA("kvcluster-ca.other.ns", time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	trusted, untrusted := clientOf(t, ca, ca), clientOf(t, ca, other)
	for _, tc := range []struct {
		name                   string
		transport              specs.Transport
		plain, tls, foreignTLS bool // whether each client is answered
	}{
		{"plaintext", specs.Transport{ClientPlain: true}, true, false, false},
		{"TLS", specs.Transport{ClientTLS: true, PeerTLS: true, PeerCerts: true}, false, true, false},
		{"both", specs.Transport{ClientTLS: true, ClientPlain: true, PeerTLS: true, PeerCerts: true}, true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod, secret := tlsMember(t, kvc, tc.transport, ca)
			c := fake.NewClientBuilder().WithObjects(membershipConfigMap(kvc), pod, secret).Build()
			_, etcd := simulated(t, c)
			for _, client := range []struct {
				name     string
				scheme   string
				config   *tls.Config
				answered bool
			}{
				{"a plaintext client", "http", nil, tc.plain},
				{"a TLS client with the cluster's certificate", "https", trusted, tc.tls},
				{"a TLS client with a certificate from another CA", "https", untrusted, tc.foreignTLS},
			} {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				endpoints := specs.MemberClientURLs(kvc, client.scheme)
				_, err := etcd.WithTLS(client.config).Cluster(ctx, endpoints, urlOf(kvc))
				cancel()
				if answered := err == nil; answered != client.answered {
					t.Errorf("%s: answered %t (%v), want %t", client.name, answered, err, client.answered)
				}
			}
		})
	}
}
