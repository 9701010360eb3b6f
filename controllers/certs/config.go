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

// ClientConfigs keeps, per owner (a cluster), the TLS sessions its members offered, for as long
// as its PEM inputs stay the same. The operator connects to every member of every cluster again
// at each look (an idle fleet's connections are closed between looks): with the sessions kept,
// those connections resume one instead of verifying the member's certificate chain and signing
// with the client key again. New inputs (a renewed certificate, a rotated CA) start with no
// session of the old trust. The configuration itself is made again at each call, from the inputs:
// kept, its parsed key pair and CA (the CA parsed by the first handshake's verification) held
// more heap than the sessions, for each cluster between looks a minute apart, and making it
// (BenchmarkClientConfig) costs a small part of the handshakes it serves (BenchmarkAskingAMember).
// The zero value is ready to use.
type ClientConfigs[K comparable] struct {
	mu      sync.Mutex
	byOwner map[K]ownedSessions
}

type ownedSessions struct {
	inputs   [32]byte // digest of the PEM inputs
	sessions *compactSessions
}

// Of returns a ClientConfig for these inputs with the sessions kept for owner, when they are the
// inputs those were had with. memberPEM is the certificate the members serve (their Secret's): the
// sessions are kept without it and the CA's, which each of them carries (compactSessions). One
// owner's configuration is asked for by one caller at a time (a cluster is never reconciled twice
// at once); were it asked for concurrently with new inputs, the sessions of the last would be
// kept.
func (c *ClientConfigs[K]) Of(owner K, caPEM, certPEM, keyPEM, memberPEM []byte) (*tls.Config, error) {
	config, err := ClientConfig(caPEM, certPEM, keyPEM)
	if err != nil {
		c.Forget(owner)
		return nil, err
	}
	inputs := digest("client", caPEM, certPEM, keyPEM)
	c.mu.Lock()
	defer c.mu.Unlock()
	kept, ok := c.byOwner[owner]
	if !ok || kept.inputs != inputs {
		if c.byOwner == nil {
			c.byOwner = map[K]ownedSessions{}
		}
		kept = ownedSessions{inputs: inputs, sessions: newCompactSessions(sessionsPerClient)}
		c.byOwner[owner] = kept
	}
	config.ClientSessionCache = lookSessions{kept: kept.sessions, known: certificatesIn(caPEM, memberPEM)}
	return config, nil
}

// Forget drops owner's sessions (the cluster is gone, or speaks plaintext now).
func (c *ClientConfigs[K]) Forget(owner K) {
	c.mu.Lock()
	delete(c.byOwner, owner)
	c.mu.Unlock()
}
