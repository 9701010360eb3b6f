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
	"google.golang.org/grpc/status"
)

// Pool keeps etcd clients open between the requests of one burst of work (a cluster being
// created or upgraded is reconciled every few seconds), so those requests do not dial every
// member again each time. A client unused for the idle time is closed: an idle fleet is asked
// once a minute, and holding every member's connection between those polls would cost the
// operator memory for each member of each cluster. A client whose request failed for want of an
// answer is closed at once, so the next request dials afresh: a member restarted on another
// address, or one that stopped answering, must not leave a dead connection in use.
type Pool struct {
	idle time.Duration

	mu      sync.Mutex
	clients map[poolKey]*pooled
}

// NewPool returns a pool that closes a client once it has been unused for idle.
func NewPool(idle time.Duration) *Pool {
	return &Pool{idle: idle, clients: map[poolKey]*pooled{}}
}

// poolKey names the clients that can be shared: the same endpoints, with the same client
// certificate (a rotated certificate is a new client).
type poolKey struct {
	endpoints   string
	certificate [sha256.Size]byte
}

type pooled struct {
	cli   *clientv3.Client
	roots *x509.CertPool
	users int
	timer *time.Timer
	// gone is set when the client left the pool while in use: its last user closes it.
	gone, closed bool
}

func keyOf(endpoints []string, config *tls.Config) poolKey {
	sorted := slices.Sorted(slices.Values(endpoints))
	key := poolKey{endpoints: strings.Join(sorted, ",")}
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
// pool has none, and the function to call with the request's error when done with it.
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

// take returns the pooled client for key, in use by one more, unless its CA differs from roots
// (then it leaves the pool).
func (p *Pool) take(key poolKey, roots *x509.CertPool) *pooled {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.clients[key]
	if !ok {
		return nil
	}
	if !c.roots.Equal(roots) {
		p.drop(key, c)
		return nil
	}
	c.users++
	if c.timer != nil {
		c.timer.Stop()
	}
	return c
}

func (p *Pool) releaser(key poolKey, c *pooled) func(error) {
	return func(err error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		c.users--
		switch {
		case unanswered(err) || c.gone:
			p.drop(key, c)
		case c.users == 0:
			c.timer = time.AfterFunc(p.idle, func() { p.expire(key, c) })
		}
	}
}

// expire closes c if it is still unused.
func (p *Pool) expire(key poolKey, c *pooled) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.users == 0 {
		p.drop(key, c)
	}
}

// drop takes c out of the pool, closing it unless in use (its last user closes it); with p.mu
// held.
func (p *Pool) drop(key poolKey, c *pooled) {
	if p.clients[key] == c {
		delete(p.clients, key)
	}
	c.gone = true
	if c.users == 0 && !c.closed {
		c.closed = true
		_ = c.cli.Close()
	}
}

// Len is the number of clients the pool holds open.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.clients)
}

// unanswered reports whether err says the connection did not carry an answer (a deadline, a
// member gone or unreachable), as opposed to etcd answering with a refusal.
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
