package specs

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// The parts of a cluster's TLS: its CA, the members' client-port (server) and peer certificates,
// and the client certificate of the operator, backup Jobs and applications.
const (
	TLSCA     = "ca"
	TLSServer = "server"
	TLSPeer   = "peer"
	TLSClient = "client"

	// CACertKey is where a Secret of the cert-manager shape holds the CA's certificate.
	CACertKey = "ca.crt"
	// PreviousCAKey and PreviousCAKeyKey hold, in the CA Secret, the CA being replaced while a
	// rotation runs; RotatedForKey the value of kvcluster.io/rotate-ca the CA answers.
	PreviousCAKey    = "previous.crt"
	PreviousCAKeyKey = "previous.key"
	RotatedForKey    = "rotated-for"

	tlsMount = "/etc/etcd/tls"
)

// TLSEnabled: the cluster's client and peer traffic use mutual TLS.
func TLSEnabled(kvc *kvv1.KVCluster) bool {
	return kvc.Spec.TLS != nil && kvc.Spec.TLS.Mode != kvv1.TLSDisabled && kvc.Spec.TLS.Mode != ""
}

// TLSSecretName is the Secret holding a part of the cluster's TLS: the operator's own
// (<name>-tls-<part>) or the one the spec names (mode Secrets, or Disabled while the members move
// back from it). The CA has a Secret only in mode Operator.
func TLSSecretName(kvc *kvv1.KVCluster, part string) string {
	if t := kvc.Spec.TLS; t != nil && t.Mode != kvv1.TLSOperator && t.Secrets != nil {
		switch part {
		case TLSServer:
			return t.Secrets.Server
		case TLSPeer:
			return t.Secrets.Peer
		case TLSClient:
			return t.Secrets.Client
		}
	}
	return kvc.Name + "-tls-" + part
}

// operatorIssued: the members' certificates are the operator's, from the cluster's own CA (mode
// Operator, or back to plaintext from it). Decided by the mode, not by Secret names: Secrets you
// name may be called <name>-tls-peer too.
func operatorIssued(kvc *kvv1.KVCluster) bool {
	t := kvc.Spec.TLS
	return t == nil || t.Mode == kvv1.TLSOperator || t.Mode != kvv1.TLSSecrets && t.Secrets == nil
}

// ServerNames are the names a client may dial a member's client port by, which its certificate
// covers: every member the cluster can have (so scaling needs no new certificate), the client
// Service in each form, and the member itself from inside its pod.
func ServerNames(kvc *kvv1.KVCluster) []string {
	names := memberHosts(kvc)
	svc := ClientServiceName(kvc)
	return append(names, svc, svc+"."+kvc.Namespace, svc+"."+kvc.Namespace+".svc", "localhost", "127.0.0.1")
}

// PeerNames are the names members dial each other by.
func PeerNames(kvc *kvv1.KVCluster) []string { return memberHosts(kvc) }

func memberHosts(kvc *kvv1.KVCluster) []string {
	names := make([]string, 0, MaxMembers)
	for i := range MaxMembers {
		names = append(names, memberHost(kvc, MemberName(kvc, i)))
	}
	return names
}

// ClientCommonName is the subject of the cluster's client certificate.
func ClientCommonName(kvc *kvv1.KVCluster) string {
	return "kvcluster-client." + kvc.Name + "." + kvc.Namespace
}

// TLSSecret is a Secret of operator-issued TLS material in the shape cert-manager writes
// (kubernetes.io/tls: tls.crt, tls.key, ca.crt; the CA's adds ca.key). The cluster owns it, and
// its guard while there is one: a final backup during a foreground deletion still needs the
// client certificate, and restarting members their own.
func TLSSecret(kvc *kvv1.KVCluster, part string, data map[string][]byte, guard types.UID) *corev1ac.SecretApplyConfiguration {
	labels := Labels(kvc)
	labels[TLSPartLabel] = part
	return corev1ac.Secret(TLSSecretName(kvc, part), kvc.Namespace).
		WithLabels(labels).
		WithOwnerReferences(Owners(kvc, guard)...).
		WithType(corev1.SecretTypeTLS).
		WithData(data)
}

// TLSPartLabel says which part of a cluster's TLS an operator-issued Secret holds.
const TLSPartLabel = "kvcluster.io/tls"

// PodTLSSecrets are the Secrets a pod template mounts for its certificates, by part; nil when it
// mounts none (read from the StatefulSet: the manager's cache keeps no volumes of a pod).
func PodTLSSecrets(pod corev1.PodSpec) map[string]string {
	var out map[string]string
	for _, v := range pod.Volumes {
		if part, ok := strings.CutPrefix(v.Name, "tls-"); ok && v.Secret != nil {
			if out == nil {
				out = map[string]string{}
			}
			out[part] = v.Secret.SecretName
		}
	}
	return out
}

// tlsVolume mounts a part's Secret (read-only, owner-readable by the pod's group: Secret volumes
// are updated in place when it is renewed; etcd reads certificate files on every handshake).
func tlsVolume(kvc *kvv1.KVCluster, part string) *corev1ac.VolumeApplyConfiguration {
	return corev1ac.Volume().WithName("tls-" + part).WithSecret(corev1ac.SecretVolumeSource().
		WithSecretName(TLSSecretName(kvc, part)).WithDefaultMode(0o440))
}

func tlsMountOf(part string) *corev1ac.VolumeMountApplyConfiguration {
	return corev1ac.VolumeMount().WithName("tls-" + part).WithMountPath(tlsMount + "/" + part).WithReadOnly(true)
}

// tlsFile is the path of a key of a part's Secret where it is mounted.
func tlsFile(part, key string) string { return fmt.Sprintf("%s/%s/%s", tlsMount, part, key) }

// etcdTLSArgs are the member's TLS flags for the ports that use TLS: certificates, and a client
// certificate from the cluster's CA required (a client port that also accepts plaintext asks a
// plaintext client for nothing).
//
// By default etcd accepts a peer connection only once DNS says one of the names in the peer's
// certificate resolves to the address it comes from. Members start before their names resolve,
// and a name looked up too early is cached as missing (5 s on the local cluster, 30 s with
// kubeadm's CoreDNS): on the local cluster every TLS cluster formed ~4 s later than a plaintext
// one, its members rejecting each other meanwhile. With the operator's own CA, which issues only
// this cluster's certificates, the peer port instead takes exactly the peer certificate: it
// alone of them names a member and may authenticate a client (the server certificate may not, and
// the client certificate, which applications hold, names no member). Certificates from your
// Secrets keep etcd's DNS check: their CA may have issued others.
func etcdTLSArgs(kvc *kvv1.KVCluster, t Transport) []string {
	var args []string
	if t.ClientTLS {
		args = append(args,
			"--cert-file="+tlsFile(TLSServer, corev1.TLSCertKey),
			"--key-file="+tlsFile(TLSServer, corev1.TLSPrivateKeyKey),
			"--trusted-ca-file="+tlsFile(TLSServer, CACertKey),
			"--client-cert-auth")
	}
	if t.PeerCerts || t.PeerTLS {
		args = append(args,
			"--peer-cert-file="+tlsFile(TLSPeer, corev1.TLSCertKey),
			"--peer-key-file="+tlsFile(TLSPeer, corev1.TLSPrivateKeyKey),
			"--peer-trusted-ca-file="+tlsFile(TLSPeer, CACertKey),
			"--peer-client-cert-auth")
		if operatorIssued(kvc) {
			args = append(args,
				"--peer-skip-client-san-verification",
				"--peer-cert-allowed-hostname="+PeerNames(kvc)[0])
		}
	}
	return args
}

// backupTLSArgs are the flags with which the backup program finds the client certificate, which
// the Job mounts; none over plaintext.
func backupTLSArgs(scheme string) []string {
	if scheme != "https" {
		return nil
	}
	return []string{"--cacert=" + tlsFile(TLSClient, CACertKey), "--cert=" + tlsFile(TLSClient, corev1.TLSCertKey),
		"--key-file=" + tlsFile(TLSClient, corev1.TLSPrivateKeyKey)}
}
