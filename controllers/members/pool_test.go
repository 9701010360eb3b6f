package members

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

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
			pool := NewPool(time.Hour, 10)
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

// idleClient is a client of a member that is never asked: it connects only when asked.
func idleClient(t *testing.T) (*clientv3.Client, error) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://127.0.0.1:1"}})
	if err == nil {
		t.Cleanup(func() { _ = cli.Close() })
	}
	return cli, err
}

func closed(cli *clientv3.Client) bool {
	return cli.ActiveConnection().GetState() == connectivity.Shutdown
}

// A client is closed once unused for the idle time, or at once when a request on it went
// unanswered, but never while another request still uses it; etcd's refusals keep it.
func TestPooledClientsCloseOnlyWhenNobodyUsesThem(t *testing.T) {
	endpoints := []string{"http://kv-0:2379"}
	acquire := func(pool *Pool) (*clientv3.Client, func(error)) {
		t.Helper()
		cli, release, err := pool.acquire(endpoints, nil, func() (*clientv3.Client, error) { return idleClient(t) })
		if err != nil {
			t.Fatal(err)
		}
		return cli, release
	}
	unanswered := status.Error(codes.Unavailable, "connection refused")
	refused := errors.New("etcdserver: can only promote a learner member which is in sync with leader")

	pool := NewPool(time.Hour, 10)
	a, releaseA := acquire(pool)
	b, releaseB := acquire(pool)
	if a != b {
		t.Fatal("two requests at once got two clients, want one shared")
	}
	releaseA(unanswered)
	if closed(a) {
		t.Fatal("closed while another request still used it")
	}
	c, releaseC := acquire(pool)
	if c == a {
		t.Fatal("a client whose request went unanswered was handed out again")
	}
	releaseB(nil)
	if !closed(a) {
		t.Error("not closed when its last user was done")
	}
	releaseC(refused)
	if again, release := acquire(pool); again != c {
		t.Error("a client etcd answered with a refusal was not handed out again")
	} else {
		release(nil)
		release(unanswered) // a second call changes nothing
	}
	if pool.Len() != 1 {
		t.Errorf("the pool holds %d clients, want 1", pool.Len())
	}

	pool = NewPool(20*time.Millisecond, 10)
	d, releaseD := acquire(pool)
	releaseD(nil)
	e, releaseE := acquire(pool) // used again before the idle time ends
	time.Sleep(60 * time.Millisecond)
	if d != e || closed(e) {
		t.Fatal("closed while in use, after the idle time of an earlier use")
	}
	releaseE(nil)
	deadline := time.Now().Add(5 * time.Second)
	for !closed(e) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !closed(e) || pool.Len() != 0 {
		t.Errorf("unused for the idle time: closed %v, %d clients in the pool; want closed, none", closed(e), pool.Len())
	}
}

// Past maxUnused unused clients, the one unused for longest is closed; those in use are not.
func TestThePoolKeepsAtMostMaxUnusedClients(t *testing.T) {
	pool := NewPool(time.Hour, 2)
	acquire := func(member string) (*clientv3.Client, func(error)) {
		t.Helper()
		cli, release, err := pool.acquire([]string{member}, nil, func() (*clientv3.Client, error) { return idleClient(t) })
		if err != nil {
			t.Fatal(err)
		}
		return cli, release
	}
	inUse, _ := acquire("http://kv-0:2379")
	first, releaseFirst := acquire("http://kv-1:2379")
	second, releaseSecond := acquire("http://kv-2:2379")
	third, releaseThird := acquire("http://kv-3:2379")
	releaseFirst(nil)
	releaseSecond(nil)
	if again, release := acquire("http://kv-1:2379"); again != first { // first is now the latest used
		t.Fatal("an unused client within the bound was not handed out again")
	} else {
		release(nil)
	}
	releaseThird(nil)
	if !closed(second) || closed(first) || closed(third) || closed(inUse) {
		t.Errorf("three unused, bound two: closed first %v, second %v, third %v, in use %v; want only the second (unused for longest)",
			closed(first), closed(second), closed(third), closed(inUse))
	}
	if pool.Len() != 3 {
		t.Errorf("the pool holds %d clients, want 3 (two unused, one in use)", pool.Len())
	}
}

// The unused clients of a cluster's members close at once when the cluster will not be asked
// again for longer than the idle time (a healthy cluster's next look, a minute away); they stay
// when it will be asked sooner, and clients in use or of other members stay.
func TestClientsNotNeededForLongerThanTheIdleTimeCloseAtOnce(t *testing.T) {
	now := time.Now()
	ca, err := certs.NewCA("ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(certs.Client, []string{"operator"}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		config *tls.Config
	}{{"plaintext", nil}, {"TLS", clientConfig(t, ca, leaf)}} {
		t.Run(tc.name, func(t *testing.T) {
			pool := NewPool(10*time.Second, 10)
			acquire := func(member string) (*clientv3.Client, func(error)) {
				t.Helper()
				cli, release, err := pool.acquire([]string{member}, tc.config, func() (*clientv3.Client, error) { return idleClient(t) })
				if err != nil {
					t.Fatal(err)
				}
				return cli, release
			}
			asked, releaseAsked := acquire("https://kv-0:2379")
			releaseAsked(nil)
			inUse, releaseInUse := acquire("https://kv-1:2379")
			other, releaseOther := acquire("https://other-0:2379")
			releaseOther(nil)
			cluster := []string{"https://kv-0:2379", "https://kv-1:2379", "https://kv-2:2379"}

			pool.notNeededFor(cluster, tc.config, 5*time.Second)
			if closed(asked) || pool.Len() != 3 {
				t.Fatalf("asked again within the idle time: closed %v, %d clients in the pool; want open, 3", closed(asked), pool.Len())
			}
			pool.notNeededFor(cluster, tc.config, time.Minute)
			if !closed(asked) || closed(inUse) || closed(other) || pool.Len() != 2 {
				t.Errorf("not asked for a minute: closed %v, in use closed %v, another member's closed %v, %d clients in the pool; want only the unused one of the cluster closed, 2 left",
					closed(asked), closed(inUse), closed(other), pool.Len())
			}
			if again, release := acquire("https://kv-0:2379"); again == asked {
				t.Error("a closed client was handed out again")
			} else {
				release(nil)
			}
			releaseInUse(nil)
			if again, release := acquire("https://kv-1:2379"); again != inUse {
				t.Error("the client in use then was not kept")
			} else {
				release(nil)
			}
		})
	}
}

// A client whose connection is failing is not handed out again: gRPC would hold its requests
// through its reconnection backoff, which grows to minutes.
func TestAPooledClientWithAFailingConnectionIsNotHandedOut(t *testing.T) {
	pool := NewPool(time.Hour, 10)
	endpoints := []string{"http://127.0.0.1:1"} // nothing listens there
	dial := func() (*clientv3.Client, error) { return idleClient(t) }
	cli, release, err := pool.acquire(endpoints, nil, dial)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, _ = cli.MemberList(ctx)
	release(nil) // as if its error had been etcd's own
	deadline := time.Now().Add(5 * time.Second)
	for cli.ActiveConnection().GetState() != connectivity.TransientFailure && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	again, release, err := pool.acquire(endpoints, nil, dial)
	if err != nil {
		t.Fatal(err)
	}
	defer release(nil)
	if again == cli {
		t.Errorf("a client in %s was handed out again", cli.ActiveConnection().GetState())
	}
	if !closed(cli) {
		t.Error("the failing client was not closed")
	}
}
