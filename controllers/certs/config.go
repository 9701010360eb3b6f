package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ClientConfig is the TLS configuration of a client of a cluster's members: it presents certPEM
// and trusts only the cluster's CA (caPEM). Errors say which part is wrong, never its contents.
func ClientConfig(caPEM, certPEM, keyPEM []byte) (*tls.Config, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("client certificate and key do not form a pair: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the CA certificate (ca.crt) holds no PEM certificate")
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
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
