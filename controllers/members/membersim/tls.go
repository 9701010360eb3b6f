package membersim

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"path"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// handshakeTimeout bounds how long a connection may take to say which scheme it speaks and to
// finish a TLS handshake.
const handshakeTimeout = 5 * time.Second

// secured is the connection c as the member's client port takes it: as it is when the member
// listens on plaintext (or on both and the client does not start a TLS handshake, which etcd
// tells by the first byte), through a TLS handshake with the member's server certificate
// otherwise, a client certificate from the cluster's CA required when the member asks for one.
func (s *Sim) secured(ctx context.Context, c *targetConn, pod *corev1.Pod) (net.Conn, error) {
	transport, _ := specs.PodTransport(pod.Spec)
	if !transport.ClientTLS {
		return c, nil
	}
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	if transport.ClientPlain {
		first, err := c.r.Peek(1)
		if err != nil {
			return nil, err
		}
		if first[0] != 0x16 { // not a TLS handshake record
			_ = c.SetDeadline(time.Time{})
			return c, nil
		}
	}
	config, err := s.serverConfig(ctx, c.t, pod)
	if err != nil {
		return nil, err
	}
	tc := tls.Server(c, config)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return tc, nil
}

// servedCertificate is a member's server certificate, as parsed from one version of its Secret.
type servedCertificate struct {
	resourceVersion string
	config          *tls.Config
}

// serverConfig is the TLS configuration of the member's client port, read as etcd reads it: the
// files its flags name (--cert-file, --key-file, --trusted-ca-file), from the Secret its pod
// mounts where they are. A Secret's version is parsed once: the operator gives every member of a
// cluster the same flags with the same Secret, so the Secret alone keys what was parsed.
func (s *Sim) serverConfig(ctx context.Context, t target, pod *corev1.Pod) (*tls.Config, error) {
	files := etcdFlags(pod, "--cert-file=", "--key-file=", "--trusted-ca-file=")
	if files[0] == "" || files[1] == "" {
		return nil, fmt.Errorf("member %s listens on https without --cert-file and --key-file", t.member)
	}
	secretName, err := mountedSecret(pod, path.Dir(files[0]))
	if err != nil {
		return nil, err
	}
	key := types.NamespacedName{Namespace: pod.Namespace, Name: secretName}
	var secret corev1.Secret
	err = s.Pods.Get(ctx, key, &secret)
	if err != nil && s.Live != nil { // a Secret made since the cache last heard: the kubelet reads the API server
		err = s.Live.Get(ctx, key, &secret)
	}
	if err != nil {
		return nil, fmt.Errorf("member %s's server certificate: %w", t.member, err)
	}
	s.mu.Lock()
	served, ok := s.served[key]
	s.mu.Unlock()
	if ok && served.resourceVersion == secret.ResourceVersion {
		return served.config, nil
	}
	pair, err := tls.X509KeyPair(secret.Data[path.Base(files[0])], secret.Data[path.Base(files[1])])
	if err != nil {
		return nil, fmt.Errorf("member %s's server certificate: %w", t.member, err)
	}
	config := &tls.Config{Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
	if etcdFlags(pod, "--client-cert-auth")[0] != "" {
		pool := x509.NewCertPool()
		if files[2] == "" || !pool.AppendCertsFromPEM(secret.Data[path.Base(files[2])]) {
			return nil, fmt.Errorf("member %s requires client certificates and trusts no CA", t.member)
		}
		config.ClientCAs, config.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	s.mu.Lock()
	if s.served == nil {
		s.served = map[types.NamespacedName]servedCertificate{}
	}
	s.served[key] = servedCertificate{resourceVersion: secret.ResourceVersion, config: config}
	s.mu.Unlock()
	return config, nil
}

// etcdFlags are the values of the etcd container's flags with the given prefixes ("" when not
// given; a flag without a value, such as --client-cert-auth, gives its own name).
func etcdFlags(pod *corev1.Pod, prefixes ...string) []string {
	values := make([]string, len(prefixes))
	for _, c := range pod.Spec.Containers {
		if c.Name != "etcd" {
			continue
		}
		for _, arg := range c.Args {
			for i, p := range prefixes {
				if v, ok := strings.CutPrefix(arg, p); ok && strings.HasSuffix(p, "=") {
					values[i] = v
				} else if arg == p {
					values[i] = p
				}
			}
		}
	}
	return values
}

// mountedSecret is the Secret the etcd container has mounted at dir.
func mountedSecret(pod *corev1.Pod, dir string) (string, error) {
	for _, c := range pod.Spec.Containers {
		if c.Name != "etcd" {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.MountPath != dir {
				continue
			}
			for _, v := range pod.Spec.Volumes {
				if v.Name == m.Name && v.Secret != nil {
					return v.Secret.SecretName, nil
				}
			}
		}
	}
	return "", errors.New("no Secret is mounted at " + dir)
}
