package specs

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// Transport is how members listen: peer traffic over TLS or plaintext (one port, one scheme), and
// which schemes the client port accepts. It is the spec's (DesiredTransport), except while a
// running cluster moves from plaintext to TLS: then the client port accepts both on the way, so
// that no client is cut off before every member speaks the new scheme.
type Transport struct {
	// PeerTLS: the peer listener is https. PeerCerts: the member has its peer certificate, with
	// which it dials peers that listen on https; a member moving to TLS has it before its own
	// listener moves (a leader without it could not send a snapshot to a member on https).
	PeerTLS, PeerCerts     bool
	ClientTLS, ClientPlain bool
}

// DesiredTransport is how the spec wants members to listen.
func DesiredTransport(kvc *kvv1.KVCluster) Transport {
	if !TLSEnabled(kvc) {
		return Transport{ClientPlain: true}
	}
	return Transport{PeerTLS: true, PeerCerts: true, ClientTLS: true, ClientPlain: kvc.Spec.TLS.PlaintextClients == kvv1.PlaintextClientsAccept}
}

// ClientScheme is the scheme a client of these members uses: https when the client port accepts
// it (a client certificate is the stronger guarantee), else http.
func (t Transport) ClientScheme() string {
	if t.ClientTLS {
		return "https"
	}
	return "http"
}

// PeerScheme is the scheme of the members' peer URLs.
func (t Transport) PeerScheme() string {
	if t.PeerTLS {
		return "https"
	}
	return "http"
}

// UsesTLS: the member needs its certificates.
func (t Transport) UsesTLS() bool { return t.PeerCerts || t.ClientTLS }

func (t Transport) clientSchemes() []string {
	var s []string
	if t.ClientTLS {
		s = append(s, "https")
	}
	if t.ClientPlain {
		s = append(s, "http")
	}
	return s
}

// The etcd flags PodTransport reads, and all of them: TransportArgs keeps these.
const (
	listenClientURLsFlag = "--listen-client-urls="
	listenPeerURLsFlag   = "--listen-peer-urls="
	peerCertFileFlag     = "--peer-cert-file="
)

var transportFlags = []string{listenClientURLsFlag, listenPeerURLsFlag, peerCertFileFlag}

// TransportArgs are the arguments of a container that PodTransport reads: all of them a reader
// of its pods' transport needs to keep (the manager's cache keeps only these of a pod).
func TransportArgs(args []string) []string {
	var kept []string
	for _, arg := range args {
		if slices.ContainsFunc(transportFlags, func(flag string) bool { return strings.HasPrefix(arg, flag) }) {
			kept = append(kept, arg)
		}
	}
	return kept
}

// PodTransport is how a member pod (or a pod template) listens, read from its etcd container's
// flags (transportFlags); false when it has no etcd container with them.
func PodTransport(pod corev1.PodSpec) (Transport, bool) {
	for _, c := range pod.Containers {
		if c.Name != etcdContainerName {
			continue
		}
		var t Transport
		var client, peer bool
		for _, arg := range TransportArgs(c.Args) {
			if urls, ok := strings.CutPrefix(arg, listenClientURLsFlag); ok {
				client = true
				for _, u := range strings.Split(urls, ",") {
					t.ClientTLS = t.ClientTLS || strings.HasPrefix(u, "https://")
					t.ClientPlain = t.ClientPlain || strings.HasPrefix(u, "http://")
				}
			}
			if urls, ok := strings.CutPrefix(arg, listenPeerURLsFlag); ok {
				peer = true
				t.PeerTLS = strings.HasPrefix(urls, "https://")
			}
			t.PeerCerts = t.PeerCerts || strings.HasPrefix(arg, peerCertFileFlag)
		}
		return t, client && peer
	}
	return Transport{}, false
}

// clientURLs are the client port's URLs on host, one per scheme it accepts: etcd serves both on
// one port, telling a TLS handshake from plaintext on each connection.
func (t Transport) clientURLs(host string) string {
	var urls []string
	for _, s := range t.clientSchemes() {
		urls = append(urls, fmt.Sprintf("%s://%s:%d", s, host, ClientPort))
	}
	return strings.Join(urls, ",")
}

// peerURL is a member's peer URL on host. A member reads its own only when it first starts; one
// that moves to TLS later has it changed in etcd's membership by the operator (plan's
// ActUpdatePeerURL).
func (t Transport) peerURL(host string) string {
	return fmt.Sprintf("%s://%s:%d", t.PeerScheme(), host, PeerPort)
}

// String describes the transport for messages.
func (t Transport) String() string {
	peers := "plaintext peers"
	switch {
	case t.PeerTLS:
		peers = "peers over TLS"
	case t.PeerCerts:
		peers = "plaintext peers with peer certificates"
	}
	clients := "plaintext clients"
	switch {
	case t.ClientTLS && t.ClientPlain:
		clients = "clients over TLS or plaintext"
	case t.ClientTLS:
		clients = "clients over TLS"
	}
	return peers + ", " + clients
}
