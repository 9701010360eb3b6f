package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
)

// sessionsPerClient bounds the TLS sessions a client configuration remembers: one per member it
// speaks to.
const sessionsPerClient = 16

// ClientConfig is the TLS configuration of a client of a cluster's members: it presents certPEM
// and trusts only the cluster's CA (caPEM). Errors say which part is wrong, never its contents.
// It remembers the sessions the members offer, so that a connection made again with it resumes
// one: no certificates sent, verified or signed with anew.
func ClientConfig(caPEM, certPEM, keyPEM []byte) (*tls.Config, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("client certificate and key do not form a pair: %v", err)
	}
	// The parsed certificate is not kept: a client reads it only to choose what to present in a
	// full handshake, which then parses it again, and a kept configuration mostly resumes
	// sessions instead. Kept, it was 2.7 KB of the 14.7 KB a configuration with one member's
	// session holds (BenchmarkAKeptClientConfig), for each cluster.
	pair.Leaf = nil
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the CA certificate (ca.crt) holds no PEM certificate")
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12,
		ClientSessionCache: newCompactSessions(sessionsPerClient)}, nil
}

// LoadClientConfig is ClientConfig from the files of a mounted Secret, read now.
func LoadClientConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	var pems [3][]byte
	for i, f := range []string{caFile, certFile, keyFile} {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		pems[i] = data
	}
	return ClientConfig(pems[0], pems[1], pems[2])
}

// ClientConfigs keeps one ClientConfig per owner (a cluster) for as long as its PEM inputs stay
// the same. The operator connects to every member of every cluster again at each look (an idle
// fleet's connections are closed between looks): with the same configuration, and so its
// remembered sessions, those connections resume a session instead of verifying the member's
// certificate chain and signing with the client key again, and the key pair and CA are not
// parsed again either. New inputs (a renewed certificate, a rotated CA) make a new configuration,
// with no session of the old trust. The zero value is ready to use.
type ClientConfigs[K comparable] struct {
	mu      sync.Mutex
	byOwner map[K]ownedConfig
}

type ownedConfig struct {
	inputs [32]byte // digest of the PEM inputs
	config *tls.Config
}

// Of returns owner's ClientConfig for these inputs: the one it has if they are the same. One
// owner's configuration is asked for by one caller at a time (a cluster is never reconciled twice
// at once); were it asked for concurrently with new inputs, the last one made would be kept.
func (c *ClientConfigs[K]) Of(owner K, caPEM, certPEM, keyPEM []byte) (*tls.Config, error) {
	inputs := digest("client", caPEM, certPEM, keyPEM)
	c.mu.Lock()
	kept, ok := c.byOwner[owner]
	c.mu.Unlock()
	if ok && kept.inputs == inputs {
		return kept.config, nil
	}
	config, err := ClientConfig(caPEM, certPEM, keyPEM)
	if err != nil {
		c.Forget(owner)
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byOwner == nil {
		c.byOwner = map[K]ownedConfig{}
	}
	c.byOwner[owner] = ownedConfig{inputs: inputs, config: config}
	return config, nil
}

// Forget drops owner's configuration (the cluster is gone, or speaks plaintext now).
func (c *ClientConfigs[K]) Forget(owner K) {
	c.mu.Lock()
	delete(c.byOwner, owner)
	c.mu.Unlock()
}
