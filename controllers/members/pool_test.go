package members

import (
	"crypto/tls"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvcluster/kvcluster-operator/controllers/certs"
)

func clientConfig(t *testing.T, ca certs.CA, leaf certs.Leaf) *tls.Config {
	t.Helper()
	config, err := certs.ClientConfig(ca.CertPEM, leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return config
}

// A pooled client is handed out again only for the same endpoints with the same client
// certificate and CA: a rotated certificate or CA gets a client of its own.
func TestAPooledClientIsSharedOnlyWithTheSameEndpointsAndCredentials(t *testing.T) {
	now := time.Now()
	ca, err := certs.NewCA("ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := certs.NewCA("other-ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(certs.Client, []string{"operator"}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := ca.Issue(certs.Client, []string{"operator"}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	endpoints := []string{"https://kv-0:2379", "https://kv-1:2379"}
	first := clientConfig(t, ca, leaf)
	for _, tc := range []struct {
		name      string
		endpoints []string
		config    *tls.Config
		shared    bool
	}{
		{"the same, built again", []string{endpoints[1], endpoints[0]}, clientConfig(t, ca, leaf), true},
		{"another member set", endpoints[:1], clientConfig(t, ca, leaf), false},
		{"a renewed client certificate", endpoints, clientConfig(t, ca, renewed), false},
		{"another CA", endpoints, clientConfig(t, otherCA, leaf), false},
		{"plaintext", endpoints, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := NewPool(time.Hour)
			dials := 0
			dial := func(eps []string, config *tls.Config) func() (*clientv3.Client, error) {
				return func() (*clientv3.Client, error) {
					dials++
					// Not connected until asked: no member needs to exist.
					return clientv3.New(clientv3.Config{Endpoints: eps, TLS: config})
				}
			}
			_, release, err := pool.acquire(endpoints, first, dial(endpoints, first))
			if err != nil {
				t.Fatal(err)
			}
			release(nil)
			_, release, err = pool.acquire(tc.endpoints, tc.config, dial(tc.endpoints, tc.config))
			if err != nil {
				t.Fatal(err)
			}
			release(nil)
			if shared := dials == 1; shared != tc.shared {
				t.Errorf("dialled %d times: shared %v, want %v", dials, shared, tc.shared)
			}
		})
	}
}
