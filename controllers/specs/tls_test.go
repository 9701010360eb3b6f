package specs

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

func withTLS(kvc *kvv1.KVCluster, mode kvv1.TLSMode) *kvv1.KVCluster {
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: mode}
	if mode == kvv1.TLSSecrets {
		kvc.Spec.TLS.Secrets = &kvv1.TLSSecretNames{Server: "my-server", Peer: "my-peer", Client: "my-client"}
	}
	return kvc
}

// TestTLSMembers: with TLS, members listen and advertise https on both ports, require a client
// certificate from the cluster's CA on both, and read their certificates from the Secrets'
// volumes; the metrics port (probes) stays plain HTTP. Without it nothing changes.
func TestTLSMembers(t *testing.T) {
	tests := []struct {
		name        string
		kvc         *kvv1.KVCluster
		wantScheme  string
		wantSecrets []string
		// wantPeerCertOnly: the peer port takes the peer certificate by its name instead of
		// asking DNS (the operator's own CA only).
		wantPeerCertOnly bool
	}{
		{name: "plaintext", kvc: cluster(3), wantScheme: "http"},
		{name: "Disabled is plaintext", kvc: withTLS(cluster(3), kvv1.TLSDisabled), wantScheme: "http"},
		{name: "the operator's certificates", kvc: withTLS(cluster(3), kvv1.TLSOperator), wantScheme: "https", wantSecrets: []string{"kv-tls-server", "kv-tls-peer"}, wantPeerCertOnly: true},
		{name: "your Secrets", kvc: withTLS(cluster(3), kvv1.TLSSecrets), wantScheme: "https", wantSecrets: []string{"my-server", "my-peer"}},
		{name: "your Secrets, named like the operator's", kvc: func() *kvv1.KVCluster {
			kvc := withTLS(cluster(3), kvv1.TLSSecrets)
			kvc.Spec.TLS.Secrets = &kvv1.TLSSecretNames{Server: "kv-tls-server", Peer: "kv-tls-peer", Client: "kv-tls-client"}
			return kvc
		}(), wantScheme: "https", wantSecrets: []string{"kv-tls-server", "kv-tls-peer"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kvc := tt.kvc
			args := strings.Join(EtcdArgs(kvc, DesiredTransport(kvc), 0), " ")
			for _, want := range []string{"--listen-client-urls=" + tt.wantScheme + "://0.0.0.0:2379", "--listen-peer-urls=" + tt.wantScheme + "://0.0.0.0:2380",
				"--advertise-client-urls=" + tt.wantScheme + "://$(POD_NAME).kv-peer.prod.svc:2379", "--initial-advertise-peer-urls=" + tt.wantScheme + "://$(POD_NAME).kv-peer.prod.svc:2380",
				"--listen-metrics-urls=http://0.0.0.0:2381"} {
				if !strings.Contains(args, want) {
					t.Errorf("args lack %s: %s", want, args)
				}
			}
			tlsFlags := []string{"--client-cert-auth", "--peer-client-cert-auth", "--cert-file=/etc/etcd/tls/server/tls.crt", "--peer-trusted-ca-file=/etc/etcd/tls/peer/ca.crt"}
			for _, f := range tlsFlags {
				if strings.Contains(args, f) != (tt.wantScheme == "https") {
					t.Errorf("flag %s present %t, want %t", f, strings.Contains(args, f), tt.wantScheme == "https")
				}
			}
			peerCertOnly := strings.Contains(args, "--peer-skip-client-san-verification --peer-cert-allowed-hostname=kv-0.kv-peer.prod.svc")
			if peerCertOnly != tt.wantPeerCertOnly || strings.Contains(args, "--peer-skip-client-san-verification") != tt.wantPeerCertOnly {
				t.Errorf("the peer port takes the peer certificate by its name: %t, want %t: %s", peerCertOnly, tt.wantPeerCertOnly, args)
			}
			for _, u := range []string{MemberClientURL(kvc, DesiredTransport(kvc).ClientScheme(), 2), MemberPeerURL(kvc, 2), ClientEndpoint(kvc, DesiredTransport(kvc).ClientScheme()), InitialCluster(kvc)} {
				if !strings.HasPrefix(u, tt.wantScheme+"://") && !strings.Contains(u, "="+tt.wantScheme+"://") {
					t.Errorf("%s is not %s", u, tt.wantScheme)
				}
			}
			if ord, ok := OrdinalOfPeerURL(kvc, MemberPeerURL(kvc, 2)); !ok || ord != 2 {
				t.Errorf("OrdinalOfPeerURL(%s) = %d, %t", MemberPeerURL(kvc, 2), ord, ok)
			}
			pod := StatefulSet(kvc, MemberSet{Replicas: 3}).Spec.Template.Spec
			var secrets []string
			for _, v := range pod.Volumes {
				if v.Secret != nil {
					secrets = append(secrets, *v.Secret.SecretName)
				}
			}
			if !slices.Equal(secrets, tt.wantSecrets) || len(pod.Containers[0].VolumeMounts) != 1+len(tt.wantSecrets) {
				t.Errorf("Secret volumes %v, mounts %d; want %v mounted", secrets, len(pod.Containers[0].VolumeMounts), tt.wantSecrets)
			}
		})
	}
}

// TestTLSBackupJob: a backup Job of a cluster with TLS mounts the client certificate and hands it
// to the backup program.
func TestTLSBackupJob(t *testing.T) {
	kvc := withTLS(cluster(3), kvv1.TLSOperator)
	kvc.Spec.Backup = &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "backups"}}
	job := BackupJob(kvc, ScheduledBackupRun(kvc, "kv-1"), "op:1")
	c := job.Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--endpoints=https://kv-0.kv-peer.prod.svc:2379,", "--cacert=/etc/etcd/tls/client/ca.crt",
		"--cert=/etc/etcd/tls/client/tls.crt", "--key-file=/etc/etcd/tls/client/tls.key"} {
		if !strings.Contains(args, want) {
			t.Errorf("args lack %s: %s", want, args)
		}
	}
	var mounted bool
	for _, v := range job.Spec.Template.Spec.Volumes {
		mounted = mounted || (v.Secret != nil && *v.Secret.SecretName == "kv-tls-client")
	}
	if !mounted {
		t.Error("the client certificate's Secret is not mounted")
	}
}

// TestTLSNames: the server certificate covers every member the cluster can have and the client
// Service in each form, so scaling needs no new certificate.
func TestTLSNames(t *testing.T) {
	kvc := cluster(3)
	names := ServerNames(kvc)
	for _, want := range []string{"kv-0.kv-peer.prod.svc", "kv-8.kv-peer.prod.svc", "kv-client", "kv-client.prod", "kv-client.prod.svc", "localhost", "127.0.0.1"} {
		if !slices.Contains(names, want) {
			t.Errorf("server names lack %s: %v", want, names)
		}
	}
	if peers := PeerNames(kvc); len(peers) != MaxMembers || slices.Contains(peers, "kv-client") {
		t.Errorf("peer names %v, want the %d members only", peers, MaxMembers)
	}
}

// TestTransportsRoundTrip: what a pod runs is read back from its flags as the transport it was
// made with, for every transport a cluster passes through on its way to TLS; a client port that
// accepts both schemes lists both on one port, and asks for client certificates on TLS only.
func TestTransportsRoundTrip(t *testing.T) {
	kvc := withTLS(cluster(3), kvv1.TLSOperator)
	for _, tr := range []Transport{{ClientPlain: true}, {PeerCerts: true, ClientTLS: true, ClientPlain: true},
		{PeerTLS: true, PeerCerts: true, ClientTLS: true, ClientPlain: true}, {PeerTLS: true, PeerCerts: true, ClientTLS: true}} {
		t.Run(tr.String(), func(t *testing.T) {
			sts := StatefulSet(kvc, MemberSet{Replicas: 3, Transport: tr})
			c := sts.Spec.Template.Spec.Containers[0]
			got, ok := PodTransport(corev1.PodSpec{Containers: []corev1.Container{{Name: *c.Name, Args: c.Args}}})
			if !ok || got != tr {
				t.Errorf("read back %v (%t) from %v", got, ok, c.Args)
			}
			args := strings.Join(c.Args, " ")
			if tr.ClientTLS && tr.ClientPlain && !strings.Contains(args, "--listen-client-urls=https://0.0.0.0:2379,http://0.0.0.0:2379 ") {
				t.Errorf("client port not on both schemes: %s", args)
			}
			if strings.Contains(args, "--client-cert-auth") != tr.ClientTLS || strings.Contains(args, "--peer-client-cert-auth") != tr.PeerCerts {
				t.Errorf("certificate flags do not follow the transport: %s", args)
			}
			if mounted := len(sts.Spec.Template.Spec.Volumes) > 0; mounted != tr.UsesTLS() {
				t.Errorf("certificates mounted %t", mounted)
			}
		})
	}
	if _, ok := PodTransport(corev1.PodSpec{Containers: []corev1.Container{{Name: "other"}}}); ok {
		t.Error("a pod without an etcd container has a transport")
	}
}

// TestPeerCertificateCheckWhileMovingBack: members moving back to plaintext keep the peer check
// of the certificates they started the move with: by name for the operator's, by DNS for yours.
func TestPeerCertificateCheckWhileMovingBack(t *testing.T) {
	moving := Transport{PeerTLS: true, PeerCerts: true, ClientTLS: true, ClientPlain: true}
	fromOperator := withTLS(cluster(3), kvv1.TLSDisabled)
	fromSecrets := withTLS(cluster(3), kvv1.TLSDisabled)
	fromSecrets.Spec.TLS.Secrets = &kvv1.TLSSecretNames{Server: "my-server", Peer: "my-peer", Client: "my-client"}
	for kvc, want := range map[*kvv1.KVCluster]bool{fromOperator: true, fromSecrets: false} {
		args := strings.Join(EtcdArgs(kvc, moving, 0), " ")
		if got := strings.Contains(args, "--peer-skip-client-san-verification"); got != want {
			t.Errorf("secrets %+v: the peer certificate taken by its name %t, want %t: %s", kvc.Spec.TLS.Secrets, got, want, args)
		}
	}
}
