package controllers

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members/memberstest"
	"github.com/kvcluster/kvcluster-operator/deploy"
)

// TestANamespacedInstallGrantsPerNamespaceOnlyWhatIsNamespaced: a Role grants nothing on what is
// not namespaced (a StorageClass, say), so every such resource the operator needs must be in the
// ClusterRole of a namespaced install; the API server's discovery says which they are.
func TestANamespacedInstallGrantsPerNamespaceOnlyWhatIsNamespaced(t *testing.T) {
	mapper, err := apiutil.NewDynamicRESTMapper(restConfig, httpClient(t))
	if err != nil {
		t.Fatal(err)
	}
	role, err := deploy.OperatorRole()
	if err != nil {
		t.Fatal(err)
	}
	_, namespaced := deploy.NamespacedRules(role.Rules)
	for _, rule := range namespaced {
		for _, resource := range rule.Resources {
			resource, _, _ = strings.Cut(resource, "/") // a subresource has its resource's scope
			gvk, err := mapper.KindFor(schema.GroupVersionResource{Group: rule.APIGroups[0], Resource: resource})
			if err != nil {
				t.Fatalf("%s.%s: %v", resource, rule.APIGroups[0], err)
			}
			mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatal(err)
			}
			if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
				t.Errorf("%s.%s is not namespaced: a Role in a watched namespace would not grant it", resource, rule.APIGroups[0])
			}
		}
	}
}

func httpClient(t *testing.T) *http.Client {
	t.Helper()
	c, err := rest.HTTPClientFor(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAnOperatorWatchingSomeNamespacesRunsTheirClustersAlone: with --watch-namespaces the
// operator's cache watches those namespaces only, so it runs with what a namespaced install
// grants (Roles there, a ClusterRole for KVClusters): a cluster there goes Ready, one elsewhere is
// not touched.
func TestAnOperatorWatchingSomeNamespacesRunsTheirClustersAlone(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	watched, elsewhere := h.namespace("watched"), h.namespace("elsewhere")
	theirs := newKVCluster(elsewhere, "kv", 3)
	h.create(theirs)
	kvc := newKVCluster(watched, "kv", 3)
	h.members.set(memberstest.Healthy(kvc, 3, "3.7.3"), nil)
	startManagerAs(t, asNamespacedOperator(t, "ops-"+watched, watched), []string{watched}, nil, h.members, 8)

	h.create(kvc)
	eventually(t, "the watched namespace's KVCluster started no reconcile", func() bool {
		return h.client.Get(ctx, client.ObjectKeyFromObject(kvc), &appsv1.StatefulSet{}) == nil
	})
	h.setMembersReady(kvc, 3)
	eventually(t, "the watched namespace's KVCluster did not turn Ready", func() bool { return h.fresh(kvc).Status.Phase == kvv1.PhaseReady })

	// Created first, the other namespace's cluster would have been reconciled by now.
	time.Sleep(time.Second)
	if got := h.fresh(theirs); got.Status.Phase != "" || len(got.Finalizers) > 0 {
		t.Errorf("a KVCluster in a namespace not watched was reconciled: phase %q, finalizers %v", got.Status.Phase, got.Finalizers)
	}
	if err := h.client.Get(ctx, client.ObjectKeyFromObject(theirs), &appsv1.StatefulSet{}); err == nil {
		t.Error("a KVCluster in a namespace not watched got members")
	}
}

// TestDeletingAWatchedNamespaceLetsItsClustersGo: when a watched namespace is deleted, the
// namespace controller deletes the operator's Role there as soon as anything else; the clusters,
// whose members are going with the namespace, still let go of their finalizer (through the
// ClusterRole for KVClusters) rather than hold the namespace's deletion for good.
func TestDeletingAWatchedNamespaceLetsItsClustersGo(t *testing.T) {
	admin := newHarness(t)
	ns := admin.namespace("watched")
	h := newHarnessAs(t, asNamespacedOperator(t, "ops-"+ns, ns))
	kvc := withBackups(newKVCluster(ns, "kv", 3), "")
	h.readyCluster(kvc)

	admin.deleteNamespace(ns)
	h.deleteAndReconcile(kvc)
	if !h.gone(kvc) {
		t.Fatalf("the KVCluster held its namespace's deletion: %+v", h.fresh(kvc).Status.Deletion)
	}
	if ev := drainEvents(h); !strings.Contains(ev, "namespace is being deleted") {
		t.Errorf("events = %q, want why no final backup was taken", ev)
	}
}

// TestAnOperatorStartedWhileAWatchedNamespaceIsDeletedLetsItsClustersGo: started (restarted,
// newly elected) while a watched namespace is being deleted and its Role is gone already, the
// operator still watches that namespace's KVClusters, and lets them go, rather than leave the
// namespace Terminating for good.
func TestAnOperatorStartedWhileAWatchedNamespaceIsDeletedLetsItsClustersGo(t *testing.T) {
	admin := newHarness(t)
	ns, spare := admin.namespace("leaving"), admin.namespace("spare")
	operator := asNamespacedOperator(t, "ops-"+ns, ns, spare)
	h := newHarnessAs(t, operator)
	kvc := withBackups(newKVCluster(ns, "kv", 1), "")
	h.readyCluster(kvc)
	admin.deleteNamespace(ns) // while no operator runs
	if err := admin.client.Delete(context.Background(), h.fresh(kvc)); err != nil {
		t.Fatal(err)
	}
	startManagerAs(t, operator, []string{spare}, []string{ns}, h.members, 8)
	eventually(t, "the KVCluster of the namespace being deleted kept its finalizer", func() bool { return h.gone(kvc) })
}

// deleteNamespace deletes a namespace with a cluster "kv" in it and plays what the namespace
// controller, which envtest does not run, deletes first: the operator's Role there (a namespaced
// install's) and the members' StatefulSet. The namespace stays Terminating.
func (h *harness) deleteNamespace(ns string) {
	h.t.Helper()
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kvcluster-operator"}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kvcluster-operator"}},
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kv"}},
	} {
		if err := h.client.Delete(context.Background(), obj); err != nil {
			h.t.Fatal(err)
		}
	}
}
