package members

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// Pool keeps etcd clients open between the requests of one burst of work (a cluster being
// created or upgraded is reconciled every few seconds), so those requests do not dial every
// member again each time. A client unused for the idle time is closed: an idle fleet is asked
// once a minute, and holding every member's connection between those polls would cost the
// operator memory for each member of each cluster. A client whose request went unanswered, or
// whose connection is failing, leaves the pool at once (closed when its last user is done), so
// the next request dials afresh: a member restarted elsewhere, or one that stopped answering, is
// not asked on a dead connection or after gRPC's reconnection backoff.
//
// At most maxUnused clients are kept unused: a fleet's burst of work (a thousand clusters created
// at once) would otherwise hold every member's connection for the idle time; past the bound, the
// client unused for longest is closed.
//
// Clients are shared by endpoints and credentials only: every client in one pool must come from
// one EtcdClient's settings (timeout, dial options).
type Pool struct {
	idle      time.Duration
	maxUnused int

	mu      sync.Mutex
	clients map[poolKey]*pooled
	// unused counts the clients in the pool that no request uses; releases orders their releases.
	unused, releases int
}

// NewPool returns a pool that closes a client once it has been unused for idle, and keeps at most
// maxUnused clients unused.
func NewPool(idle time.Duration, maxUnused int) *Pool {
	return &Pool{idle: idle, maxUnused: maxUnused, clients: map[poolKey]*pooled{}}
}

// poolKey names the clients that can be shared: the same endpoints, with the same client
// certificate (a renewed certificate is a new client).
type poolKey struct {
	endpoints   string
	certificate [sha256.Size]byte
}

type pooled struct {
	cli   *clientv3.Client
	roots *x509.CertPool
	users int
	// released is the pool's count of releases when the client last became unused: an expiry
	// timer closes it only if it has not been used since the timer was set, and past maxUnused the
	// lowest goes first.
	released int
	// gone is set when the client left the pool; its last user closes it.
	gone, closed bool
}

func keyOf(endpoints []string, config *tls.Config) poolKey {
	key := poolKey{endpoints: strings.Join(slices.Sorted(slices.Values(endpoints)), ",")}
	if config != nil {
		h := sha256.New()
		for _, c := range config.Certificates {
			for _, der := range c.Certificate {
				h.Write(der)
			}
		}
		copy(key.certificate[:], h.Sum(nil))
	}
	return key
}

func rootsOf(config *tls.Config) *x509.CertPool {
	if config == nil {
		return nil
	}
	return config.RootCAs
}

// acquire returns a client for endpoints speaking with config, dialling one with dial if the
// pool has none it can hand out, and the function to call once with the request's error when
// done with it.
func (p *Pool) acquire(endpoints []string, config *tls.Config, dial func() (*clientv3.Client, error)) (*clientv3.Client, func(error), error) {
	key := keyOf(endpoints, config)
	if c := p.take(key, rootsOf(config)); c != nil {
		return c.cli, p.releaser(key, c), nil
	}
	cli, err := dial()
	if err != nil {
		return nil, nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.clients[key]; ok {
		// Another request dialled the same endpoints meanwhile: this one's client stays its own.
		return cli, func(error) { _ = cli.Close() }, nil
	}
	c := &pooled{cli: cli, roots: rootsOf(config), users: 1}
	p.clients[key] = c
	return cli, p.releaser(key, c), nil
}

// take returns the pooled client for key, in use by one more, unless it cannot serve: its CA
// differs from roots, or its connection is failing (gRPC would wait out its reconnection
// backoff, which grows to minutes, before sending anything).
func (p *Pool) take(key poolKey, roots *x509.CertPool) *pooled {
	var closing *clientv3.Client
	defer func() { closeClient(closing) }()
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.clients[key]
	if !ok {
		return nil
	}
	if state := c.cli.ActiveConnection().GetState(); !c.roots.Equal(roots) || state == connectivity.TransientFailure || state == connectivity.Shutdown {
		closing = p.drop(key, c)
		return nil
	}
	if c.users == 0 {
		p.unused--
	}
	c.users++
	return c
}

func (p *Pool) releaser(key poolKey, c *pooled) func(error) {
	var once sync.Once
	return func(err error) {
		once.Do(func() {
			var closing *clientv3.Client
			defer func() { closeClient(closing) }()
			p.mu.Lock()
			defer p.mu.Unlock()
			c.users--
			if c.users == 0 && p.clients[key] == c {
				p.unused++
			}
			switch {
			case unanswered(err) || c.gone:
				closing = p.drop(key, c)
			case c.users == 0:
				p.releases++
				c.released = p.releases
				released := c.released
				time.AfterFunc(p.idle, func() { p.expire(key, c, released) })
				if p.unused > p.maxUnused {
					closing = p.dropLongestUnused()
				}
			}
		})
	}
}

// notNeededFor closes now the unused clients of the members at endpoints (with config) when they
// will not be asked again for next, longer than the idle time: a healthy cluster looked at once a
// minute would otherwise hold its members' connections for the idle time of each minute, unused,
// and at a thousand clusters keep the pool at its bound (and every release scanning it). Clients
// in use are left to their users.
func (p *Pool) notNeededFor(endpoints []string, config *tls.Config, next time.Duration) {
	if next <= p.idle {
		return
	}
	var closing []*clientv3.Client
	defer func() {
		for _, cli := range closing {
			closeClient(cli)
		}
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, endpoint := range endpoints {
		key := keyOf([]string{endpoint}, config)
		if c, ok := p.clients[key]; ok && c.users == 0 {
			closing = append(closing, p.drop(key, c))
		}
	}
}

// dropLongestUnused drops the client unused for longest and returns it to be closed; with p.mu
// held. A scan: the pool holds at most maxUnused clients and those in use.
func (p *Pool) dropLongestUnused() *clientv3.Client {
	var oldestKey poolKey
	var oldest *pooled
	for key, c := range p.clients {
		if c.users == 0 && (oldest == nil || c.released < oldest.released) {
			oldestKey, oldest = key, c
		}
	}
	if oldest == nil {
		return nil
	}
	return p.drop(oldestKey, oldest)
}

// expire closes c if it has not been used since it became unused for the released-th time.
func (p *Pool) expire(key poolKey, c *pooled, released int) {
	var closing *clientv3.Client
	defer func() { closeClient(closing) }()
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.users == 0 && c.released == released {
		closing = p.drop(key, c)
	}
}

// drop takes c out of the pool and returns its client if nobody uses it, for the caller to close
// once p.mu is released (closing tears connections down, which must not hold up other requests);
// with p.mu held.
func (p *Pool) drop(key poolKey, c *pooled) *clientv3.Client {
	if p.clients[key] == c {
		delete(p.clients, key)
		if c.users == 0 {
			p.unused--
		}
	}
	c.gone = true
	if c.users > 0 || c.closed {
		return nil
	}
	c.closed = true
	return c.cli
}

func closeClient(cli *clientv3.Client) {
	if cli != nil {
		_ = cli.Close()
	}
}

// Len is the number of clients the pool holds.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.clients)
}

// unanswered reports whether err says the connection carried no answer (a deadline, a member gone
// or unreachable), as opposed to etcd answering with a refusal (etcd's own errors, such as a
// learner not ready, keep the client). A deadline used up by earlier requests of the same
// reconcile also counts: the client is dialled again, which costs a dial, nothing else.
func unanswered(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}
