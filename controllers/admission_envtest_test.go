package controllers

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	kvv1ac "github.com/kvcluster/kvcluster-operator/apis/applyconfiguration/apis/v1alpha1"
	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// bindTLSByDefault installs deploy/admission's policy, bound to namespace ns alone (the other
// tests keep their clusters as they create them), and waits until the API server applies it.
func bindTLSByDefault(t *testing.T, h *harness, ns string) {
	t.Helper()
	ctx := context.Background()
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "admission", "tls-by-default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(raw), "\n---\n")
	var policy admissionregistrationv1.MutatingAdmissionPolicy
	var binding admissionregistrationv1.MutatingAdmissionPolicyBinding
	if len(docs) != 2 || yaml.UnmarshalStrict([]byte(docs[0]), &policy) != nil || yaml.UnmarshalStrict([]byte(docs[1]), &binding) != nil {
		t.Fatalf("deploy/admission/tls-by-default.yaml is not one policy and its binding")
	}
	policy.Name += "-" + ns
	binding.Name, binding.Spec.PolicyName = binding.Name+"-"+ns, policy.Name
	binding.Spec.MatchResources = &admissionregistrationv1.MatchResources{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}
	for _, obj := range []client.Object{&policy, &binding} {
		if err := h.client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.client.Delete(ctx, obj) })
	}
	// A new policy takes effect within seconds; until the API server has compiled it against the
	// CRD's schema, a create may also be refused.
	for range 60 {
		probe := newKVCluster(ns, "probe", 1)
		if err = h.client.Create(ctx, probe); err == nil {
			defaulted := probe.Spec.TLS != nil
			if err := h.client.Delete(ctx, probe); err != nil {
				t.Fatal(err)
			}
			if defaulted {
				return
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("the TLS-by-default policy never took effect (last: %v)", err)
}

// TestNewClustersGetTLSByDefault: with the policy deploy/default installs, a KVCluster created
// without spec.tls gets mutual TLS from the operator; one that says otherwise keeps what it says;
// one created before keeps plaintext; and a GitOps tool re-applying a manifest without spec.tls
// neither removes it nor is refused.
func TestNewClustersGetTLSByDefault(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	ns := h.namespace("tlsdefault")
	before := newKVCluster(ns, "before", 1)
	h.create(before)
	bindTLSByDefault(t, h, ns)

	modeOf := func(name string) kvv1.TLSMode {
		t.Helper()
		got := &kvv1.KVCluster{}
		h.get(got, ns, name)
		if got.Spec.TLS == nil {
			return ""
		}
		return got.Spec.TLS.Mode
	}
	for name, tls := range map[string]*kvv1.TLSSpec{
		"unset":    nil,
		"disabled": {Mode: kvv1.TLSDisabled},
		"secrets":  {Mode: kvv1.TLSSecrets, Secrets: &kvv1.TLSSecretNames{Server: "s", Peer: "p", Client: "c"}},
	} {
		kvc := newKVCluster(ns, name, 1)
		kvc.Spec.TLS = tls
		h.create(kvc)
	}
	for name, want := range map[string]kvv1.TLSMode{"unset": kvv1.TLSOperator, "disabled": kvv1.TLSDisabled, "secrets": kvv1.TLSSecrets} {
		if got := modeOf(name); got != want {
			t.Errorf("created with tls %s: mode %q, want %q", name, got, want)
		}
	}

	b := h.fresh(before)
	b.Spec.Partitions = 3
	if err := h.client.Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	if got := modeOf("before"); got != "" {
		t.Errorf("a cluster created before the policy was given mode %q on an update; want it left plaintext", got)
	}

	apply := func(manager string, tls *kvv1ac.TLSSpecApplyConfiguration) error {
		spec := kvv1ac.KVClusterSpec().WithVersion("3.7.3").WithPartitions(1)
		if tls != nil {
			spec.WithTLS(tls)
		}
		return h.client.Apply(ctx, kvv1ac.KVCluster("gitops", ns).WithSpec(spec), client.FieldOwner(manager))
	}
	for i := range 2 {
		if err := apply("flux", nil); err != nil {
			t.Fatalf("apply %d without spec.tls: %v", i+1, err)
		}
		if got := modeOf("gitops"); got != kvv1.TLSOperator {
			t.Errorf("after apply %d without spec.tls: mode %q, want Operator", i+1, got)
		}
	}
	if err := apply("argocd", kvv1ac.TLSSpec().WithMode(kvv1.TLSOperator)); err != nil {
		t.Fatal(err)
	}
	if err := apply("argocd", nil); err != nil {
		t.Errorf("a manager that stopped stating spec.tls is refused: %v", err)
	}
	if got := modeOf("gitops"); got != kvv1.TLSOperator {
		t.Errorf("a manager that stopped stating spec.tls turned it to %q", got)
	}
}
