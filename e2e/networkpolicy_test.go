//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// TestNetworkPolicyAdmitsOnlyWhatTheClusterNeeds proves from inside pods, on the local cluster
// whose kube-router enforces NetworkPolicies, what a cluster's policy lets through: the members
// form and the operator manages them through it; a pod of the cluster's namespace reaches the
// client port but neither the peer port nor (metricsFrom naming a monitoring namespace) the
// metrics port; a pod of another namespace reaches nothing until clientsFrom names its namespace;
// the monitoring namespace reaches the metrics port only.
func TestNetworkPolicyAdmitsOnlyWhatTheClusterNeeds(t *testing.T) {
	if !localCluster {
		t.Skip("only on the project's local cluster (E2E_LOCAL_CLUSTER=1), whose kube-router enforces NetworkPolicies and which has the netcheck image")
	}
	var kvc *kvv1.KVCluster
	var other, monitoring string
	app := map[string]string{"app": "shop"}
	// Addresses of member 0 and of the client Service, by IP: a name that did not resolve would
	// pass for a refused connection.
	var peerPort, clientPort, metricsPort, service, apiServer string
	namespaceSelector := func(ns string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}
	}
	// probes are idle netcheck pods, one per namespace, labelled app=shop; checks run in them with
	// kubectl exec, so from addresses kube-router has already seen.
	probes := map[string]string{}
	// check runs netcheck in the probe of namespace ns. Settled: the policy is not changing, so an
	// address that must be refused fails the check the first time it connects; otherwise (just
	// after a change) every check is tried again until all hold, for up to 45 s.
	check := func(t *testing.T, cfg *envconf.Config, ns string, settled bool, reach, refused []string) {
		t.Helper()
		// The API server's address shows the probe's own networking works.
		args := []string{"-timeout=3s", "-for=45s", fmt.Sprintf("-settled=%t", settled), "-reach=" + apiServer}
		for _, a := range reach {
			args = append(args, "-reach="+a)
		}
		for _, a := range refused {
			args = append(args, "-dial="+a)
		}
		out, err := kubectl(cfg, append([]string{"-n", ns, "exec", probes[ns], "--", "/netcheck"}, args...)...)
		if err != nil {
			t.Errorf("from a pod of %s, want %v reachable and %v refused (%v):\n%s", ns, reach, refused, err, out)
			return
		}
		t.Logf("from %s:\n%s", ns, out)
	}

	f := features.New("a cluster's NetworkPolicy, enforced, admits only what the cluster needs").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			r := cfg.Client().Resources()
			ns := envconf.RandomName("kvc-netpol", 16)
			other, monitoring = envconf.RandomName("kvc-apps", 16), envconf.RandomName("kvc-mon", 16)
			for _, n := range []string{ns, other, monitoring} {
				if err := r.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
					t.Fatal(err)
				}
			}
			kvc = &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: "fenced", Namespace: ns},
				Spec: kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 3,
					NetworkPolicy: &kvv1.NetworkPolicySpec{MetricsFrom: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: namespaceSelector(monitoring)}}}}}
			if err := r.Create(ctx, kvc); err != nil {
				t.Fatal(err)
			}
			for _, n := range []string{ns, other, monitoring} {
				probes[n] = idleProbe(ctx, t, cfg, n, app)
			}
			var api corev1.Service
			if err := r.Get(ctx, "kubernetes", "default", &api); err != nil {
				t.Fatal(err)
			}
			apiServer = api.Spec.ClusterIP + ":443"
			return ctx
		}).
		Assess("the members form and the operator manages them through their policy", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			waitReady(ctx, t, cfg, kvc, 5*time.Minute)
			np := &networkingv1.NetworkPolicy{}
			if err := cfg.Client().Resources().Get(ctx, "fenced-members", kvc.Namespace, np); err != nil {
				t.Fatalf("no NetworkPolicy: %v", err)
			}
			if got := get(ctx, t, cfg, kvc); got.Spec.NetworkPolicy == nil || got.Spec.NetworkPolicy.Mode != kvv1.NetworkPolicyManaged {
				t.Errorf("spec.networkPolicy = %+v, want mode Managed (the CRD's default)", got.Spec.NetworkPolicy)
			}
			var pod corev1.Pod
			var svc corev1.Service
			if err := cfg.Client().Resources().Get(ctx, "fenced-0", kvc.Namespace, &pod); err != nil {
				t.Fatal(err)
			}
			if err := cfg.Client().Resources().Get(ctx, "fenced-client", kvc.Namespace, &svc); err != nil {
				t.Fatal(err)
			}
			peerPort, clientPort, metricsPort = pod.Status.PodIP+":2380", pod.Status.PodIP+":2379", pod.Status.PodIP+":2381"
			service = svc.Spec.ClusterIP + ":2379"
			return ctx
		}).
		Assess("its namespace reaches the client port only; other namespaces nothing; the monitoring namespace the metrics port only", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			check(t, cfg, kvc.Namespace, true, []string{clientPort, service}, []string{peerPort, metricsPort})
			check(t, cfg, other, true, nil, []string{clientPort, service, peerPort, metricsPort})
			check(t, cfg, monitoring, true, []string{metricsPort}, []string{clientPort, service, peerPort})
			return ctx
		}).
		Assess("naming another namespace's pods in clientsFrom lets them in, and only them", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			editSpec(ctx, t, cfg, kvc, func(k *kvv1.KVCluster) {
				k.Spec.NetworkPolicy.ClientsFrom = []networkingv1.NetworkPolicyPeer{{NamespaceSelector: namespaceSelector(other),
					PodSelector: &metav1.LabelSelector{MatchLabels: app}}}
			})
			check(t, cfg, other, false, []string{clientPort, service}, []string{peerPort, metricsPort})
			// The namespace default gave way to what the spec names (this pod reached it before).
			check(t, cfg, kvc.Namespace, false, nil, []string{clientPort, service})
			return ctx
		}).
		Teardown(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			for _, n := range []string{kvc.Namespace, other, monitoring} {
				_ = cfg.Client().Resources().Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})
			}
			return ctx
		}).Feature()
	testAlongsideOthers(t, f)
}
