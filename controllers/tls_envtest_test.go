package controllers

import (
	"bytes"
	"context"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/certs"
	"github.com/kvcluster/kvcluster-operator/controllers/members/memberstest"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// TestATLSClusterGetsItsCertificates: a cluster with tls.mode Operator gets a CA and a server,
// peer and client certificate in Secrets it owns, covering every name its members and clients
// use; its members listen on https; an idle reconcile writes nothing; a lost certificate is
// issued again from the same CA.
func TestATLSClusterGetsItsCertificates(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	ns := h.namespace("tls")
	kvc := newKVCluster(ns, "kv", 3)
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	h.create(kvc)
	h.members.set(memberstest.Healthy(kvc, 3, "3.7.3"), nil)
	h.reconcile(kvc)

	secret := func(part string) *corev1.Secret {
		var s corev1.Secret
		h.get(&s, ns, "kv-tls-"+part)
		return &s
	}
	ca := secret(specs.TLSCA)
	for _, tt := range []struct {
		part  string
		usage certs.Usage
		names []string
	}{
		{part: specs.TLSServer, usage: certs.Server, names: specs.ServerNames(kvc)},
		{part: specs.TLSPeer, usage: certs.Peer, names: specs.PeerNames(kvc)},
		{part: specs.TLSClient, usage: certs.Client, names: []string{specs.ClientCommonName(kvc)}},
	} {
		s := secret(tt.part)
		if !controlledBy(s, h.fresh(kvc)) || s.Type != corev1.SecretTypeTLS {
			t.Errorf("Secret %s: type %s, owners %v; want a TLS Secret the cluster controls", s.Name, s.Type, s.OwnerReferences)
		}
		if err := certs.Check(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey], ca.Data[corev1.TLSCertKey], tt.usage, tt.names, h.clock.Now()); err != nil {
			t.Errorf("the %s certificate does not fit: %v", tt.part, err)
		}
	}
	var sts appsv1.StatefulSet
	h.get(&sts, ns, "kv")
	if args := strings.Join(sts.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--listen-client-urls=https://") || !strings.Contains(args, "--client-cert-auth") {
		t.Errorf("members do not require TLS: %s", args)
	}
	h.setMembersReady(kvc, 3)
	h.reconcile(kvc)
	firstClient := h.members.presentedCertificate()
	if want := derOf(t, secret(specs.TLSClient).Data[corev1.TLSCertKey]); !bytes.Equal(firstClient, want) {
		t.Error("the members were not asked presenting the client Secret's certificate")
	}
	if got := h.fresh(kvc); got.Status.Phase != kvv1.PhaseReady || !strings.HasPrefix(got.Status.ClientEndpoint, "https://") {
		t.Fatalf("phase %s, endpoint %s; want Ready on https", got.Status.Phase, got.Status.ClientEndpoint)
	}
	var shown []string
	for _, c := range h.fresh(kvc).Status.Certificates {
		shown = append(shown, c.Name)
		if c.Name != specs.TLSCA && (c.RenewAt == nil || !c.RenewAt.Time.After(h.clock.Now().Add(59*24*time.Hour)) || !c.NotAfter.Time.After(c.RenewAt.Time)) {
			t.Errorf("certificate %+v: want it renewed two thirds into its 90 days", c)
		}
	}
	if strings.Join(shown, ",") != "ca,server,peer,client" {
		t.Errorf("status.certificates show %v, want every part", shown)
	}
	drainEvents(h)
	h.assertIdle(kvc, "a Ready cluster with TLS")

	// Sixty-one days on, two thirds into their 90 days, the certificates are renewed from the same CA.
	server := secret(specs.TLSServer)
	h.clock.SetTime(h.clock.Now().Add(61 * 24 * time.Hour))
	h.reconcile(kvc)
	renewed := secret(specs.TLSServer)
	if string(renewed.Data[corev1.TLSCertKey]) == string(server.Data[corev1.TLSCertKey]) ||
		certs.Check(renewed.Data[corev1.TLSCertKey], renewed.Data[corev1.TLSPrivateKeyKey], ca.Data[corev1.TLSCertKey], certs.Server, specs.ServerNames(kvc), h.clock.Now()) != nil {
		t.Errorf("the server certificate was not renewed from the same CA two thirds into its life")
	}
	if ev := drainEvents(h); strings.Count(ev, plan.EventCertificateIssued) != 3 || !strings.Contains(ev, "due for renewal") {
		t.Errorf("events = %q, want the three certificates' renewals announced", ev)
	}

	peer := secret(specs.TLSPeer)
	if err := h.client.Delete(ctx, peer); err != nil {
		t.Fatal(err)
	}
	h.reconcile(kvc)
	again := secret(specs.TLSPeer)
	if err := certs.Check(again.Data[corev1.TLSCertKey], again.Data[corev1.TLSPrivateKeyKey], ca.Data[corev1.TLSCertKey], certs.Peer,
		specs.PeerNames(kvc), h.clock.Now()); again.UID == peer.UID || err != nil {
		t.Errorf("the lost peer certificate was not issued again from the same CA: %v", err)
	}
	if ev := drainEvents(h); !strings.Contains(ev, plan.EventCertificateIssued) {
		t.Errorf("events = %q, want the new certificate announced", ev)
	}
	// The configuration kept for the cluster's connections (and the sessions they resume) is not
	// the renewed certificate's: the members are asked presenting the renewed one.
	if got, want := h.members.presentedCertificate(), derOf(t, secret(specs.TLSClient).Data[corev1.TLSCertKey]); bytes.Equal(got, firstClient) || !bytes.Equal(got, want) {
		t.Errorf("after the renewal the members were asked presenting the certificate of before (%v), want the renewed one", bytes.Equal(got, firstClient))
	}
}

// derOf is the first certificate of a PEM bundle, DER-encoded.
func derOf(t *testing.T, certPEM []byte) []byte {
	t.Helper()
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("no PEM block")
	}
	return block.Bytes
}

// TestTLSAdmissionAndYourSecrets: the TLS mode moves from plaintext to TLS and back, and mode
// Secrets needs its Secrets; Secrets that are missing stop the cluster with a condition and an
// event (nothing is written), and once they are there it goes on; moving back keeps using them.
func TestTLSAdmissionAndYourSecrets(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	ns := h.namespace("tlsadm")

	bad := newKVCluster(ns, "nosecrets", 1)
	bad.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSSecrets}
	checkAdmission(t, h.client.Create(ctx, bad), "tls.secrets is required with mode Secrets")
	badName := newKVCluster(ns, "badname", 1)
	badName.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSSecrets, Secrets: &kvv1.TLSSecretNames{Server: "Etcd_Server", Peer: "p", Client: "c"}}
	checkAdmission(t, h.client.Create(ctx, badName), "spec.tls.secrets.server")
	badMode := newKVCluster(ns, "badmode", 1)
	badMode.Spec.TLS = &kvv1.TLSSpec{Mode: "Mutual"}
	checkAdmission(t, h.client.Create(ctx, badMode), "spec.tls.mode")

	acceptWithout := newKVCluster(ns, "acceptwithout", 1)
	acceptWithout.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSDisabled, PlaintextClients: kvv1.PlaintextClientsAccept}
	checkAdmission(t, h.client.Create(ctx, acceptWithout), "plaintextClients: Accept needs TLS")

	// A running plaintext cluster may move to TLS and back; between the modes is refused (every
	// case: apis/v1alpha1's TestTLSModeChanges).
	plain := newKVCluster(ns, "plain", 1)
	h.create(plain)
	p := h.fresh(plain)
	p.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator, PlaintextClients: kvv1.PlaintextClientsAccept}
	if err := h.client.Update(ctx, p); err != nil {
		t.Fatalf("moving a plaintext cluster to TLS was refused: %v", err)
	}
	p = h.fresh(plain)
	p.Spec.TLS.Mode = kvv1.TLSSecrets
	p.Spec.TLS.Secrets = &kvv1.TLSSecretNames{Server: "s", Peer: "p", Client: "c"}
	checkAdmission(t, h.client.Update(ctx, p), "tls.mode can change only from plaintext to TLS")
	p = h.fresh(plain)
	p.Spec.TLS = nil
	if err := h.client.Update(ctx, p); err != nil {
		t.Fatalf("moving a cluster of mode Operator back to plaintext was refused: %v", err)
	}

	kvc := newKVCluster(ns, "kv", 1)
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSSecrets, Secrets: &kvv1.TLSSecretNames{Server: "etcd-server", Peer: "etcd-peer", Client: "etcd-client"}}
	h.create(kvc)
	h.reconcile(kvc)
	got := h.fresh(kvc)
	stalled := meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionStalled)
	if got.Status.Phase != kvv1.PhaseFailed || stalled == nil || stalled.Reason != plan.ReasonTLSInvalid || !strings.Contains(stalled.Message, "etcd-server") {
		t.Fatalf("phase %s, Stalled %+v; want Failed TLSInvalid naming the missing Secret", got.Status.Phase, stalled)
	}
	if ev := drainEvents(h); !strings.Contains(ev, "Warning "+plan.ReasonTLSInvalid) {
		t.Errorf("events = %q, want a TLSInvalid warning", ev)
	}
	if err := h.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kv"}, &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
		t.Errorf("a StatefulSet was written although its certificates are missing: %v", err)
	}

	// The user's certificates, e.g. written by cert-manager.
	issuer, err := certs.NewCA("users-ca", h.clock.Now(), plan.CAValidity)
	if err != nil {
		t.Fatal(err)
	}
	for name, leaf := range map[string]struct {
		usage certs.Usage
		names []string
	}{
		"etcd-server": {certs.Server, specs.ServerNames(kvc)}, "etcd-peer": {certs.Peer, specs.PeerNames(kvc)}, "etcd-client": {certs.Client, []string{"app"}},
	} {
		l, err := issuer.Issue(leaf.usage, leaf.names, h.clock.Now(), plan.LeafValidity)
		if err != nil {
			t.Fatal(err)
		}
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: l.CertPEM, corev1.TLSPrivateKeyKey: l.KeyPEM, specs.CACertKey: issuer.CertPEM}}
		if err := h.client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	// A Secret missing a key is a condition naming it, not a crash.
	var peer corev1.Secret
	h.get(&peer, ns, "etcd-peer")
	caCert := peer.Data[specs.CACertKey]
	delete(peer.Data, specs.CACertKey)
	if err := h.client.Update(ctx, &peer); err != nil {
		t.Fatal(err)
	}
	h.reconcile(kvc)
	if c := meta.FindStatusCondition(h.fresh(kvc).Status.Conditions, kvv1.ConditionStalled); c == nil || !strings.Contains(c.Message, "etcd-peer (peer certificate) has no ca.crt") {
		t.Errorf("Stalled = %+v, want the missing key named", c)
	}
	peer.Data[specs.CACertKey] = caCert
	if err := h.client.Update(ctx, &peer); err != nil {
		t.Fatal(err)
	}
	h.reconcile(kvc)
	if got := h.fresh(kvc); got.Status.Phase == kvv1.PhaseFailed {
		t.Errorf("still Failed with fitting Secrets: %+v", meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionStalled))
	}
	var sts appsv1.StatefulSet
	h.get(&sts, ns, "kv")
	var mounted []string
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			mounted = append(mounted, v.Secret.SecretName)
		}
	}
	if strings.Join(mounted, ",") != "etcd-server,etcd-peer" {
		t.Errorf("members mount %v, want the user's server and peer Secrets", mounted)
	}

	// Back to plaintext, keeping the Secrets' names: the members move through both schemes with
	// their certificates. Dropping the names before the move is done stops it, naming the Secrets
	// the members use, and the template keeps them.
	back := h.fresh(kvc)
	back.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSDisabled, Secrets: kvc.Spec.TLS.Secrets}
	if err := h.client.Update(ctx, back); err != nil {
		t.Fatalf("moving back to plaintext keeping the Secrets' names was refused: %v", err)
	}
	h.reconcile(kvc)
	moving := func() string {
		var sts appsv1.StatefulSet
		h.get(&sts, ns, "kv")
		var flags []string
		for _, a := range sts.Spec.Template.Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--listen-client-urls=") || strings.HasPrefix(a, "--listen-peer-urls=") || strings.HasPrefix(a, "--peer-cert-file=") {
				flags = append(flags, a)
			}
		}
		for _, v := range sts.Spec.Template.Spec.Volumes {
			if v.Secret != nil {
				flags = append(flags, v.Secret.SecretName)
			}
		}
		return strings.Join(flags, " ")
	}
	want := "--listen-client-urls=https://0.0.0.0:2379,http://0.0.0.0:2379 --listen-peer-urls=http://0.0.0.0:2380 --peer-cert-file=/etc/etcd/tls/peer/tls.crt etcd-server etcd-peer"
	if got := moving(); got != want {
		t.Errorf("members moving back listen and mount %q, want %q", got, want)
	}
	back = h.fresh(kvc)
	back.Spec.TLS.Secrets = nil
	if err := h.client.Update(ctx, back); err != nil {
		t.Fatal(err)
	}
	h.reconcile(kvc)
	if c := meta.FindStatusCondition(h.fresh(kvc).Status.Conditions, kvv1.ConditionStalled); c == nil || c.Reason != plan.ReasonTLSInvalid ||
		!strings.Contains(c.Message, "with the peer certificate of Secret etcd-peer, and the spec now names Secret kv-tls-peer") {
		t.Errorf("Stalled = %+v, want the move stopped naming the Secrets the members use", c)
	}
	if got := moving(); got != want {
		t.Errorf("without the Secrets' names, members listen and mount %q, want it unchanged: %q", got, want)
	}
}
