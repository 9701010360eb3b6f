package controllers

import (
	"context"
	"fmt"
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

// readPolicy reads deploy/admission/<file>: one admission policy and its binding.
func readPolicy(t *testing.T, file string, policy, binding any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "admission", file))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(raw), "\n---\n")
	if len(docs) != 2 || yaml.UnmarshalStrict([]byte(docs[0]), policy) != nil || yaml.UnmarshalStrict([]byte(docs[1]), binding) != nil {
		t.Fatalf("deploy/admission/%s is not one policy and its binding", file)
	}
}

// inNamespace binds a policy to namespace ns alone (the other tests keep their clusters as they create them).
func inNamespace(ns string) *admissionregistrationv1.MatchResources {
	return &admissionregistrationv1.MatchResources{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}
}

// installPolicy creates a policy and its binding (which must already name the policy as renamed),
// both renamed for ns, and deletes them when the test ends.
func installPolicy(t *testing.T, h *harness, ns string, policy, binding client.Object) {
	t.Helper()
	for _, obj := range []client.Object{policy, binding} {
		obj.SetName(obj.GetName() + "-" + ns)
		if err := h.client.Create(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.client.Delete(context.Background(), obj) })
	}
}

// bindValidatingPolicy installs the validating policy of deploy/admission/<file>, bound to
// namespace ns alone, and deletes it when the test ends.
func bindValidatingPolicy(t *testing.T, h *harness, ns, file string) {
	t.Helper()
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	readPolicy(t, file, &policy, &binding)
	binding.Spec.PolicyName, binding.Spec.MatchResources = policy.Name+"-"+ns, inNamespace(ns)
	installPolicy(t, h, ns, &policy, &binding)
}

// annotateOnly updates the KVCluster with this one annotation, as a person or GitOps tool would
// set it, and returns what the API server answers (admission's refusal, say).
func (h *harness) annotateOnly(kvc *kvv1.KVCluster, key, value string) error {
	k := h.fresh(kvc)
	k.Annotations = map[string]string{key: value}
	return h.client.Update(context.Background(), k)
}

// bindSecureDefaults installs deploy/admission's policies, bound to namespace ns alone (the other
// tests keep their clusters as they create them), and waits until the API server applies them.
func bindSecureDefaults(t *testing.T, h *harness, ns string) {
	t.Helper()
	ctx := context.Background()
	for _, file := range []string{"tls-by-default.yaml", "network-policy-by-default.yaml"} {
		var policy admissionregistrationv1.MutatingAdmissionPolicy
		var binding admissionregistrationv1.MutatingAdmissionPolicyBinding
		readPolicy(t, file, &policy, &binding)
		binding.Spec.PolicyName, binding.Spec.MatchResources = policy.Name+"-"+ns, inNamespace(ns)
		installPolicy(t, h, ns, &policy, &binding)
	}
	// A new policy takes effect within seconds; until the API server has compiled it against the
	// CRD's schema, a create may also be refused.
	var err error
	for range 60 {
		probe := newKVCluster(ns, "probe", 1)
		if err = h.client.Create(ctx, probe); err == nil {
			defaulted := probe.Spec.TLS != nil && probe.Spec.NetworkPolicy != nil
			if err := h.client.Delete(ctx, probe); err != nil {
				t.Fatal(err)
			}
			if defaulted {
				return
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("the secure-by-default policies never took effect (last: %v)", err)
}

// TestNewClustersAreSecureByDefault: with the policies deploy/default installs, a KVCluster
// created without spec.tls gets mutual TLS from the operator, and one without spec.networkPolicy
// gets a managed NetworkPolicy; one that says otherwise keeps what it says; one created before
// keeps plaintext and no policy; and a GitOps tool re-applying a manifest without them neither
// removes them nor is refused.
func TestNewClustersAreSecureByDefault(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	ns := h.namespace("securedefault")
	before := newKVCluster(ns, "before", 1)
	h.create(before)
	bindSecureDefaults(t, h, ns)

	// modesOf says "<tls mode>/<network policy mode>", "" for an unset one.
	modesOf := func(name string) string {
		t.Helper()
		got := &kvv1.KVCluster{}
		h.get(got, ns, name)
		var tls, np string
		if got.Spec.TLS != nil {
			tls = string(got.Spec.TLS.Mode)
		}
		if got.Spec.NetworkPolicy != nil {
			np = string(got.Spec.NetworkPolicy.Mode)
		}
		return tls + "/" + np
	}
	for name, set := range map[string]func(*kvv1.KVCluster){
		"unset": func(*kvv1.KVCluster) {},
		"disabled": func(k *kvv1.KVCluster) {
			k.Spec.TLS, k.Spec.NetworkPolicy = &kvv1.TLSSpec{Mode: kvv1.TLSDisabled}, &kvv1.NetworkPolicySpec{Mode: kvv1.NetworkPolicyDisabled}
		},
		"secrets": func(k *kvv1.KVCluster) {
			k.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSSecrets, Secrets: &kvv1.TLSSecretNames{Server: "s", Peer: "p", Client: "c"}}
		},
	} {
		kvc := newKVCluster(ns, name, 1)
		set(kvc)
		h.create(kvc)
	}
	for name, want := range map[string]string{"unset": "Operator/Managed", "disabled": "Disabled/Disabled", "secrets": "Secrets/Managed"} {
		if got := modesOf(name); got != want {
			t.Errorf("created %s: tls/networkPolicy modes %q, want %q", name, got, want)
		}
	}

	b := h.fresh(before)
	b.Spec.Partitions = 3
	if err := h.client.Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	if got := modesOf("before"); got != "/" {
		t.Errorf("a cluster created before the policies was given modes %q on an update; want both left unset", got)
	}

	apply := func(manager string, stated bool) error {
		spec := kvv1ac.KVClusterSpec().WithVersion("3.7.3").WithPartitions(1)
		if stated {
			spec.WithTLS(kvv1ac.TLSSpec().WithMode(kvv1.TLSOperator)).
				WithNetworkPolicy(kvv1ac.NetworkPolicySpec().WithMode(kvv1.NetworkPolicyManaged))
		}
		return h.client.Apply(ctx, kvv1ac.KVCluster("gitops", ns).WithSpec(spec), client.FieldOwner(manager))
	}
	for i := range 2 {
		if err := apply("flux", false); err != nil {
			t.Fatalf("apply %d without spec.tls and spec.networkPolicy: %v", i+1, err)
		}
		if got := modesOf("gitops"); got != "Operator/Managed" {
			t.Errorf("after apply %d without spec.tls and spec.networkPolicy: modes %q, want Operator/Managed", i+1, got)
		}
	}
	if err := apply("argocd", true); err != nil {
		t.Fatal(err)
	}
	if err := apply("argocd", false); err != nil {
		t.Errorf("a manager that stopped stating spec.tls and spec.networkPolicy is refused: %v", err)
	}
	if got := modesOf("gitops"); got != "Operator/Managed" {
		t.Errorf("a manager that stopped stating spec.tls and spec.networkPolicy turned them to %q", got)
	}
}

// TestABackupAskedForWithoutDestinationIsRefusedAtAdmission: with deploy/admission's
// backup-now policy, a new value of kvcluster.io/backup-now is refused when the KVCluster has no
// spec.backup or the value is too long, saying why; a value already there is not checked again,
// so a GitOps tool re-applying a manifest that still carries it after spec.backup went is not refused.
func TestABackupAskedForWithoutDestinationIsRefusedAtAdmission(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	ns := h.namespace("backupnowpolicy")
	bindValidatingPolicy(t, h, ns, "backup-now.yaml")

	plain := newKVCluster(ns, "plain", 1)
	h.create(plain)
	backedUp := withBackups(newKVCluster(ns, "backedup", 1), "")
	h.create(backedUp)
	annotate := func(kvc *kvv1.KVCluster, token string) error {
		return h.annotateOnly(kvc, kvv1.AnnotationBackupNow, token)
	}
	// The policy takes effect within seconds of its creation; until then each try is a new value.
	var err error
	for i := range 60 {
		if err = annotate(plain, fmt.Sprintf("try-%d", i)); err != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), "spec.backup is unset") {
		t.Fatalf("asking a KVCluster without spec.backup for a backup: %v, want refused because spec.backup is unset", err)
	}
	if err := annotate(backedUp, strings.Repeat("x", 64)); err == nil || !strings.Contains(err.Error(), "at most 63 characters") {
		t.Errorf("a 64-character token: %v, want refused as too long", err)
	}
	if err := annotate(backedUp, "2026-12-03T07:00:00Z"); err != nil {
		t.Fatalf("asking a KVCluster with spec.backup for a backup is refused: %v", err)
	}
	k := h.fresh(backedUp)
	k.Spec.Backup = nil
	if err := h.client.Update(ctx, k); err != nil {
		t.Errorf("dropping spec.backup while an answered request is still annotated is refused: %v", err)
	}
}

// TestADefragmentationAskedForWithATooLongTokenIsRefusedAtAdmission: with deploy/admission's
// defragment-now policy, a new value of kvcluster.io/defragment-now longer than 63 characters is
// refused, saying why; a shorter one is taken.
func TestADefragmentationAskedForWithATooLongTokenIsRefusedAtAdmission(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("defragnowpolicy")
	bindValidatingPolicy(t, h, ns, "defragment-now.yaml")

	kvc := newKVCluster(ns, "kv", 1)
	h.create(kvc)
	annotate := func(token string) error { return h.annotateOnly(kvc, kvv1.AnnotationDefragmentNow, token) }
	// The policy takes effect within seconds of its creation; until then each try is a new value.
	var err error
	for i := range 60 {
		if err = annotate(fmt.Sprintf("%063d", i)); err != nil {
			break
		}
		if err = annotate(fmt.Sprintf("%064d", i)); err != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), "kvcluster.io/defragment-now must be at most 63 characters") {
		t.Fatalf("a 64-character token: %v, want refused as too long", err)
	}
	if err := annotate("2026-12-03T08:00"); err != nil {
		t.Errorf("a short token is refused: %v", err)
	}
}
