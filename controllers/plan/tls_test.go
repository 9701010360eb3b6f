package plan

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/certs"
	"github.com/kvcluster/kvcluster-operator/controllers/members/memberstest"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// issuedTLS is the Secrets' data the operator would have issued for kvc at issued.
func issuedTLS(t *testing.T, kvc *kvv1.KVCluster, issued time.Time) map[string]map[string][]byte {
	t.Helper()
	ca, err := certs.NewCA("test-ca", issued, CAValidity)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]byte{specs.TLSCA: {corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM, specs.CACertKey: ca.CertPEM}}
	for _, p := range tlsParts(kvc) {
		leaf, err := ca.Issue(p.Usage, p.Names, issued, LeafValidity)
		if err != nil {
			t.Fatal(err)
		}
		out[p.Part] = map[string][]byte{corev1.TLSCertKey: leaf.CertPEM, corev1.TLSPrivateKeyKey: leaf.KeyPEM, specs.CACertKey: ca.CertPEM}
	}
	return out
}

func withTLS(mode kvv1.TLSMode) *kvv1.KVCluster {
	kvc := kvcIn("", 0)
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: mode}
	if mode == kvv1.TLSSecrets {
		kvc.Spec.TLS.Secrets = &kvv1.TLSSecretNames{Server: "etcd-server", Peer: "etcd-peer", Client: "etcd-client"}
	}
	return kvc
}

// withTLSSecretsDisabled is a plaintext cluster whose spec still names Secrets (of mode Secrets).
func withTLSSecretsDisabled() *kvv1.KVCluster {
	k := withTLS(kvv1.TLSSecrets)
	k.Spec.TLS.Mode = kvv1.TLSDisabled
	return k
}

func TestPlanTLS(t *testing.T) {
	operator := withTLS(kvv1.TLSOperator)
	formedOp := withTLS(kvv1.TLSOperator)
	formedOp.Status.CurrentVersion = "3.7.3"
	valid := issuedTLS(t, operator, t0)
	otherCA := issuedTLS(t, operator, t0)
	without := func(part string) map[string]map[string][]byte {
		out := map[string]map[string][]byte{}
		for k, v := range valid {
			if k != part {
				out[k] = v
			}
		}
		return out
	}
	replaced := func(part string, data map[string][]byte) map[string]map[string][]byte {
		out := without(part)
		out[part] = data
		return out
	}
	// A server certificate from before the cluster could have nine members.
	ca, _ := certs.ParseCA(valid[specs.TLSCA][corev1.TLSCertKey], valid[specs.TLSCA][corev1.TLSPrivateKeyKey])
	narrow, _ := ca.Issue(certs.Server, specs.ServerNames(operator)[:3], t0, LeafValidity)
	narrowServer := map[string][]byte{corev1.TLSCertKey: narrow.CertPEM, corev1.TLSPrivateKeyKey: narrow.KeyPEM, specs.CACertKey: ca.CertPEM}

	secrets := withTLS(kvv1.TLSSecrets)
	given := issuedTLS(t, secrets, t0)
	delete(given, specs.TLSCA)
	noKey := map[string]map[string][]byte{specs.TLSServer: given[specs.TLSServer], specs.TLSPeer: {corev1.TLSCertKey: given[specs.TLSPeer][corev1.TLSCertKey]},
		specs.TLSClient: given[specs.TLSClient]}
	swapped := map[string]map[string][]byte{specs.TLSServer: given[specs.TLSClient], specs.TLSPeer: given[specs.TLSPeer], specs.TLSClient: given[specs.TLSClient]}

	tests := []struct {
		name        string
		kvc         *kvv1.KVCluster
		secrets     map[string]map[string][]byte
		pods        map[int]Pod
		template    *specs.Transport
		mounted     map[string]string // the Secrets the template mounts, by part
		now         time.Time
		wantIssue   string // the parts issued, in order
		wantProblem string // words of the problem, or ""
		wantTrust   bool   // the members' template names the CAs they trust
	}{
		{name: "plaintext: nothing", kvc: kvcIn("", 0), now: t0},
		{name: "a new cluster: a CA, then each certificate from it", kvc: operator, now: t0, wantIssue: "ca server peer client"},
		{name: "all in place: nothing is issued", kvc: operator, secrets: valid, now: t0.Add(time.Hour)},
		{name: "a lost certificate is issued again from the same CA", kvc: operator, secrets: without(specs.TLSPeer), now: t0.Add(time.Hour), wantIssue: "peer"},
		{name: "two thirds into its life a certificate is renewed", kvc: operator, secrets: valid, now: t0.Add(LeafValidity * 2 / 3), wantIssue: "server peer client"},
		{name: "not before", kvc: operator, secrets: valid, now: t0.Add(LeafValidity*2/3 - 2*time.Hour)},
		{name: "a certificate not covering every member is issued again", kvc: operator, secrets: replaced(specs.TLSServer, narrowServer), now: t0.Add(time.Hour), wantIssue: "server"},
		{name: "a certificate of another CA is issued again", kvc: operator, secrets: replaced(specs.TLSClient, otherCA[specs.TLSClient]), now: t0.Add(time.Hour), wantIssue: "client"},
		{name: "a formed cluster's lost CA is never replaced: its members trust only the old one", kvc: formedOp, secrets: without(specs.TLSCA), now: t0.Add(time.Hour),
			wantProblem: "CA Secret kv-tls-ca is missing"},
		{name: "nor while a member runs with TLS", kvc: formedOp, secrets: without(specs.TLSCA), pods: map[int]Pod{0: {Transport: &plaintext}, 1: {Transport: &both}},
			now: t0.Add(time.Hour), wantProblem: "CA Secret kv-tls-ca is missing"},
		{name: "a running plaintext cluster moving to TLS gets its first CA", kvc: formedOp, pods: map[int]Pod{0: {Transport: &plaintext}, 1: {Transport: &plaintext}},
			template: &plaintext, now: t0, wantIssue: "ca server peer client"},
		{name: "not once its template gives members certificates", kvc: formedOp, secrets: without(specs.TLSCA), pods: map[int]Pod{0: {Transport: &plaintext}},
			template: &preparing, now: t0, wantProblem: "CA Secret kv-tls-ca is missing"},
		{name: "moving back to plaintext: nothing is issued", kvc: kvcIn("", 0), secrets: valid, pods: map[int]Pod{0: {Transport: &tlsOnly}}, template: &preparing, now: t0},
		{name: "moving back to plaintext without a Secret the members use", kvc: kvcIn("", 0), secrets: without(specs.TLSServer), pods: map[int]Pod{0: {Transport: &tlsOnly}},
			template: &preparing, now: t0, wantProblem: "Secret kv-tls-server (server certificate) does not exist"},
		{name: "back in plaintext: the Secrets are not needed", kvc: kvcIn("", 0), pods: map[int]Pod{0: {Transport: &preparing}}, template: &plaintext, now: t0},
		{name: "moving with the Secrets the move started with", kvc: kvcIn("", 0), secrets: valid, pods: map[int]Pod{0: {Transport: &tlsOnly}}, template: &preparing,
			mounted: map[string]string{specs.TLSServer: "kv-tls-server", specs.TLSPeer: "kv-tls-peer"}, now: t0},
		{name: "about to move back, the names dropped: the operator's old Secrets are not the members'", kvc: kvcIn("", 0), secrets: valid,
			pods: map[int]Pod{0: {Transport: &tlsOnly}}, template: &tlsOnly, mounted: map[string]string{specs.TLSServer: "etcd-server", specs.TLSPeer: "etcd-peer"}, now: t0,
			wantProblem: "peer certificate of Secret etcd-peer, and the spec now names Secret kv-tls-peer"},
		{name: "your Secrets renamed while not moving", kvc: withTLS(kvv1.TLSSecrets), secrets: given, pods: map[int]Pod{0: {Transport: &tlsOnly}}, template: &tlsOnly,
			mounted: map[string]string{specs.TLSServer: "old-server", specs.TLSPeer: "old-peer"}, now: t0.Add(time.Hour), wantTrust: true},
		{name: "moving, the spec names other Secrets", kvc: withTLSSecretsDisabled(), secrets: valid, pods: map[int]Pod{0: {Transport: &tlsOnly}}, template: &preparing,
			mounted: map[string]string{specs.TLSServer: "kv-tls-server", specs.TLSPeer: "kv-tls-peer"}, now: t0,
			wantProblem: "peer certificate of Secret kv-tls-peer, and the spec now names Secret etcd-peer"},
		{name: "your Secrets fit", kvc: secrets, secrets: given, now: t0.Add(time.Hour), wantTrust: true},
		{name: "your Secret is missing", kvc: secrets, secrets: map[string]map[string][]byte{specs.TLSServer: given[specs.TLSServer]}, now: t0.Add(time.Hour),
			wantProblem: "Secret etcd-peer (peer certificate) does not exist"},
		{name: "your Secret lacks a key", kvc: secrets, secrets: noKey, now: t0.Add(time.Hour), wantProblem: "Secret etcd-peer (peer certificate) has no tls.key"},
		{name: "your client certificate is no server certificate", kvc: secrets, secrets: swapped, now: t0.Add(time.Hour), wantProblem: "Secret etcd-server (server certificate) does not fit"},
		{name: "your certificates expired", kvc: secrets, secrets: given, now: t0.Add(LeafValidity + time.Hour), wantProblem: "Secret etcd-server (server certificate) does not fit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := planTLS(tt.kvc, Observation{TLS: tt.secrets, Pods: tt.pods, STSTransport: tt.template, STSTLSSecrets: tt.mounted}, tt.now)
			var issued []string
			for _, p := range got.Parts {
				if p.Issue {
					issued = append(issued, p.Part)
					if p.Data != nil || p.Why == "" {
						t.Errorf("%s is issued with data %t and why %q", p.Part, p.Data != nil, p.Why)
					}
				} else if p.Data == nil {
					t.Errorf("%s is neither kept nor issued", p.Part)
				}
			}
			if (got.Trust != "") != tt.wantTrust {
				t.Errorf("trust %q, want one %t", got.Trust, tt.wantTrust)
			}
			if strings.Join(issued, " ") != tt.wantIssue || !strings.Contains(got.Problem, tt.wantProblem) || (got.Problem == "") != (tt.wantProblem == "") {
				t.Errorf("issues %v, problem %q; want %q, %q", issued, got.Problem, tt.wantIssue, tt.wantProblem)
			}
		})
	}
}

func TestTLSProblemsStopTheClusterAndRenewalsWakeIt(t *testing.T) {
	kvc := withTLS(kvv1.TLSSecrets)
	p := Make(kvc, Observation{}, t0, Config{})
	if p.Status.Phase != kvv1.PhaseFailed || p.Reason != ReasonTLSInvalid || p.Children != nil || !strings.Contains(p.Message, "etcd-server") {
		t.Errorf("phase %s/%s, objects %t (%s); want Failed TLSInvalid with nothing written", p.Status.Phase, p.Reason, p.Children != nil, p.Message)
	}
	operator := withTLS(kvv1.TLSOperator)
	secrets := issuedTLS(t, operator, t0.Add(-time.Hour))
	notBefore, notAfter, _ := certs.Expiry(secrets[specs.TLSServer][corev1.TLSCertKey])
	renew := certs.RenewAt(notBefore, notAfter)
	etcd := memberstest.Healthy(operator, 3, "3.7.3")
	obs := Observation{TLS: secrets, ReadyMembers: 3, Cluster: &etcd, STSSettled: true}
	operator.Status = kvv1.KVClusterStatus{Phase: kvv1.PhaseReady, CurrentVersion: "3.7.3"}
	if p := Make(operator, obs, renew.Add(-30*time.Second), Config{}); p.RequeueAfter != 30*time.Second || p.OnlyLooksAgain {
		t.Errorf("requeue in %v (only looking again: %t), want at the renewal 30s from now, not behind other clusters' news", p.RequeueAfter, p.OnlyLooksAgain)
	}
	if p := Make(operator, obs, renew.Add(time.Second), Config{}); p.RequeueAfter < time.Minute || !p.OnlyLooksAgain {
		t.Errorf("requeue in %v (only looking again: %t) once the renewal is done, want the healthy poll", p.RequeueAfter, p.OnlyLooksAgain)
	}
}

// TestCARotation walks a rotation pass by pass, as a cluster goes through it: at no step is a
// certificate issued by a CA some member does not trust.
func TestCARotation(t *testing.T) {
	s := formed(3, "3.7.3")
	kvc := s.kvc
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	kvc.Annotations = map[string]string{kvv1.AnnotationRotateCA: "2026-11-30"}
	secrets := issuedTLS(t, kvc, t0.Add(-24*time.Hour))
	obs := s.obs
	obs.TLS = secrets
	parts := func(got TLS) map[string]TLSPart {
		out := map[string]TLSPart{}
		for _, p := range got.Parts {
			out[p.Part] = p
		}
		return out
	}

	// 1. Asked for: a new CA, nothing else.
	got := planTLS(kvc, obs, t0)
	if p := parts(got); !p[specs.TLSCA].Issue || !p[specs.TLSCA].Rotate || p[specs.TLSServer].Issue || got.Trust != "" {
		t.Fatalf("step 1: CA issue %t rotate %t, server issue %t, trust %q", p[specs.TLSCA].Issue, p[specs.TLSCA].Rotate, p[specs.TLSServer].Issue, got.Trust)
	}
	// The act's outcome: the new CA signs, old and new are trusted.
	oldCA, _ := certs.ParseCA(secrets[specs.TLSCA][corev1.TLSCertKey], secrets[specs.TLSCA][corev1.TLSPrivateKeyKey])
	newCA, _ := certs.NewCA("new", t0, CAValidity)
	bundle := append(append([]byte{}, oldCA.CertPEM...), newCA.CertPEM...)
	obs.TLS = map[string]map[string][]byte{specs.TLSCA: {corev1.TLSCertKey: newCA.CertPEM, corev1.TLSPrivateKeyKey: newCA.KeyPEM,
		specs.CACertKey: bundle, specs.PreviousCAKey: oldCA.CertPEM, specs.RotatedForKey: []byte("2026-11-30")}}
	for _, part := range []string{specs.TLSServer, specs.TLSPeer, specs.TLSClient} {
		obs.TLS[part] = secrets[part]
	}

	// 2. Members must trust both before anything is issued by the new CA: their template changes.
	got = planTLS(kvc, obs, t0.Add(time.Minute))
	for name, p := range parts(got) {
		if p.Issue || (name != specs.TLSCA && string(p.Data[specs.CACertKey]) != string(bundle)) {
			t.Fatalf("step 2: %s issued %t, trusts %d bytes; want kept, trusting both CAs", name, p.Issue, len(p.Data[specs.CACertKey]))
		}
	}
	if got.Trust == "" {
		t.Fatal("step 2: the members' template does not change")
	}
	for _, part := range []string{specs.TLSServer, specs.TLSPeer, specs.TLSClient} { // as act applied them
		obs.TLS[part] = parts(got)[part].Data
	}
	// Half the members restarted: still nothing from the new CA.
	obs.STSTrust = got.Trust
	pod := obs.Pods[2]
	pod.Outdated = true
	obs.Pods[2] = pod
	if p := parts(planTLS(kvc, obs, t0.Add(2*time.Minute))); p[specs.TLSServer].Issue {
		t.Fatal("step 2: issued by the new CA while a member does not trust it")
	}
	// A certificate lost meanwhile is issued by the old CA, the one every member trusts.
	peer := obs.TLS[specs.TLSPeer]
	delete(obs.TLS, specs.TLSPeer)
	if p := parts(planTLS(kvc, obs, t0.Add(2*time.Minute)))[specs.TLSPeer]; !p.Issue || !p.ByPrevious {
		t.Fatalf("step 2: a lost certificate: issue %t, by the old CA %t; want it issued by the old CA", p.Issue, p.ByPrevious)
	}
	obs.TLS[specs.TLSPeer] = peer

	// 3. Every member trusts both: every certificate is issued anew by the new CA.
	pod.Outdated = false
	obs.Pods[2] = pod
	got = planTLS(kvc, obs, t0.Add(3*time.Minute))
	for _, part := range []string{specs.TLSServer, specs.TLSPeer, specs.TLSClient} {
		if !parts(got)[part].Issue {
			t.Fatalf("step 3: %s not issued anew (%s)", part, got.Problem)
		}
	}
	for _, p := range tlsParts(kvc) {
		leaf, _ := newCA.Issue(p.Usage, p.Names, t0.Add(3*time.Minute), LeafValidity)
		obs.TLS[p.Part] = map[string][]byte{corev1.TLSCertKey: leaf.CertPEM, corev1.TLSPrivateKeyKey: leaf.KeyPEM, specs.CACertKey: bundle}
	}

	// 4. Until the new certificates surely reached the members' volumes, both CAs stay trusted.
	if p := parts(planTLS(kvc, obs, t0.Add(4*time.Minute))); p[specs.TLSCA].Why != "" {
		t.Fatal("step 4: the old CA dropped before the new certificates reached the members")
	}
	// 5. Then the old CA is dropped.
	got = planTLS(kvc, obs, t0.Add(7*time.Minute))
	ca := parts(got)[specs.TLSCA]
	if ca.Why == "" || len(ca.Data[specs.PreviousCAKey]) != 0 || string(ca.Data[specs.CACertKey]) != string(newCA.CertPEM) {
		t.Fatalf("step 5: CA (%s, %d keys); want the new CA alone trusted", ca.Why, len(ca.Data))
	}
	obs.TLS[specs.TLSCA] = ca.Data

	// 6. Members restart once more trusting the new CA only; nothing is issued, nothing rotates again.
	got = planTLS(kvc, obs, t0.Add(8*time.Minute))
	if got.Trust != "" {
		t.Fatalf("step 6: trust %q, want the template back to a single CA", got.Trust)
	}
	for name, p := range parts(got) {
		if p.Issue || p.Rotate || (name != specs.TLSCA && string(p.Data[specs.CACertKey]) != string(newCA.CertPEM)) {
			t.Fatalf("step 6: %s: issue %t, rotate %t, trusts %d bytes", name, p.Issue, p.Rotate, len(p.Data[specs.CACertKey]))
		}
	}
}

func TestTheCAIsRotatedTwoThirdsIntoItsLife(t *testing.T) {
	s := formed(3, "3.7.3")
	s.kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	s.obs.TLS = issuedTLS(t, s.kvc, t0)
	for _, tt := range []struct {
		at   time.Time
		want bool
	}{{at: t0.Add(CAValidity * 2 / 3).Add(-24 * time.Hour), want: false}, {at: t0.Add(CAValidity * 2 / 3).Add(2 * time.Hour), want: true}} {
		got := planTLS(s.kvc, s.obs, tt.at)
		if rotate := got.Parts[0].Rotate; rotate != tt.want {
			t.Errorf("at %s: rotate %t, want %t", tt.at, rotate, tt.want)
		}
	}
}

// TestACertificateIsNeverIssuedByACAMembersDoNotTrust: a CA Secret replaced under a formed cluster
// (restored from an older backup, or stripped of a rotation's old CA) signs nothing the members
// would reject; a certificate due during a stalled rotation is renewed by the old CA.
func TestACertificateIsNeverIssuedByACAMembersDoNotTrust(t *testing.T) {
	s := formed(3, "3.7.3")
	kvc := s.kvc
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	trusted := issuedTLS(t, kvc, t0.Add(-24*time.Hour))
	other := issuedTLS(t, kvc, t0.Add(-24*time.Hour))

	replaced := Observation{Pods: s.obs.Pods, STSSettled: true, TLS: map[string]map[string][]byte{}}
	for k, v := range trusted {
		replaced.TLS[k] = v
	}
	replaced.TLS[specs.TLSCA] = other[specs.TLSCA]
	got := planTLS(kvc, replaced, t0)
	for _, p := range got.Parts {
		if p.Issue {
			t.Errorf("%s is issued by a CA the members do not trust", p.Part)
		}
	}
	delete(replaced.TLS, specs.TLSPeer) // and one certificate is lost: nothing can be issued
	if got := planTLS(kvc, replaced, t0); !strings.Contains(got.Problem, "not one the members trust") {
		t.Errorf("problem %q, want the replaced CA named", got.Problem)
	}

	// A rotation that cannot go on (a member down): certificates due are renewed by the old CA.
	oldCA, _ := certs.ParseCA(trusted[specs.TLSCA][corev1.TLSCertKey], trusted[specs.TLSCA][corev1.TLSPrivateKeyKey])
	newCA, _ := certs.NewCA("new", t0, CAValidity)
	bundle := append(append([]byte{}, oldCA.CertPEM...), newCA.CertPEM...)
	stalled := s.obs
	stalled.TLS = map[string]map[string][]byte{specs.TLSCA: {corev1.TLSCertKey: newCA.CertPEM, corev1.TLSPrivateKeyKey: newCA.KeyPEM,
		specs.CACertKey: bundle, specs.PreviousCAKey: oldCA.CertPEM, specs.PreviousCAKeyKey: oldCA.KeyPEM}}
	for _, part := range []string{specs.TLSServer, specs.TLSPeer, specs.TLSClient} {
		stalled.TLS[part] = withCA(trusted[part], bundle)
	}
	pod := stalled.Pods[1]
	pod.Ready = false
	stalled.Pods[1] = pod
	for _, p := range planTLS(kvc, stalled, t0.Add(LeafValidity*2/3)).Parts {
		if p.Part != specs.TLSCA && (!p.Issue || !p.ByPrevious) {
			t.Errorf("%s due during a stalled rotation: issue %t, by the old CA %t; want renewed by the old CA", p.Part, p.Issue, p.ByPrevious)
		}
	}
}
