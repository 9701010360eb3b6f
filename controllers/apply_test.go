package controllers

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// TestHeldIntentsCompareAnythingChanged: the compare is spared only for the very version of an
// object already found to hold the very same intent; a new version (anyone's edit, its status), a
// new intent, an object re-created under the name or a cluster forgotten are compared again.
func TestHeldIntentsCompareAnythingChanged(t *testing.T) {
	kvc := newKVCluster("ns", "kv", 3)
	object := func(uid types.UID, version string) client.Object {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kv-client", Namespace: "ns", UID: uid, ResourceVersion: version}}
	}
	intent := func(port int32) any { return map[string]int32{"port": port} }
	type step struct {
		obj      client.Object
		intent   any
		equal    bool // what the compare finds
		compared bool
		held     bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first sight is compared", []step{{object("a", "1"), intent(2379), true, true, true}}},
		{"the same version and intent are not", []step{
			{object("a", "1"), intent(2379), true, true, true},
			{object("a", "1"), intent(2379), true, false, true}}},
		{"a new version is", []step{
			{object("a", "1"), intent(2379), true, true, true},
			{object("a", "2"), intent(2379), false, true, false}}},
		{"a new intent is", []step{
			{object("a", "1"), intent(2379), true, true, true},
			{object("a", "1"), intent(2380), false, true, false}}},
		{"an object re-created is", []step{
			{object("a", "1"), intent(2379), true, true, true},
			{object("b", "1"), intent(2379), false, true, false}}},
		{"an object with no resource version always is", []step{
			{object("a", ""), intent(2379), true, true, true},
			{object("a", ""), intent(2379), true, true, true}}},
		{"a difference is not remembered", []step{
			{object("a", "1"), intent(2379), false, true, false},
			{object("a", "1"), intent(2379), false, true, false}}},
		{"the same name of another kind is another object", []step{
			{object("a", "1"), intent(2379), true, true, true},
			{&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kv-client", UID: "a", ResourceVersion: "1"}}, intent(2379), true, true, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h heldIntents
			for i, s := range tc.steps {
				compared := false
				held := h.holds(kvc, s.obj, kindOf(s.obj), s.intent, func() bool { compared = true; return s.equal })
				if compared != s.compared || held != s.held {
					t.Errorf("step %d: compared %v held %v, want compared %v held %v", i, compared, held, s.compared, s.held)
				}
			}
		})
	}
	var h heldIntents
	h.holds(kvc, object("a", "1"), "Service", intent(2379), func() bool { return true })
	h.forget(types.NamespacedName{Namespace: "ns", Name: "kv"})
	compared := false
	h.holds(kvc, object("a", "1"), "Service", intent(2379), func() bool { compared = true; return true })
	if !compared {
		t.Error("a forgotten cluster's objects are not compared again")
	}
}

func kindOf(o client.Object) string {
	if _, ok := o.(*corev1.ConfigMap); ok {
		return "ConfigMap"
	}
	return "Service"
}

// BenchmarkComparingTheStatefulSet: what applyOwned spends on an unchanged StatefulSet of a TLS
// cluster, as the API server stored it: Extract and compare, and the held intent instead.
func BenchmarkComparingTheStatefulSet(b *testing.B) {
	ctx := context.Background()
	admin, err := client.New(restConfig, client.Options{Scheme: scheme})
	if err != nil {
		b.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "compare-"}}
	if err := admin.Create(ctx, ns); err != nil {
		b.Fatal(err)
	}
	kvc := newKVCluster(ns.Name, "kv", 3)
	kvc.UID = "cluster-uid"
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	intent := func() *appsv1ac.StatefulSetApplyConfiguration {
		return specs.StatefulSet(kvc, specs.MemberSet{Replicas: 3, Images: specs.Images{EtcdRepository: "registry.k8s.io/etcd"}})
	}
	desired := intent()
	if err := admin.Apply(ctx, intent(), client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
		b.Fatal(err)
	}
	var current appsv1.StatefulSet
	if err := admin.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "kv"}, &current); err != nil {
		b.Fatal(err)
	}
	extracted := func() bool {
		owned, err := appsv1ac.ExtractStatefulSet(&current, specs.FieldManager)
		return err == nil && equality.Semantic.DeepEqual(owned, desired)
	}
	b.Run("extract", func(b *testing.B) {
		for b.Loop() {
			if !extracted() {
				b.Fatal("the StatefulSet does not hold what was applied")
			}
		}
	})
	b.Run("held", func(b *testing.B) {
		var h heldIntents
		for b.Loop() {
			if !h.holds(kvc, &current, "StatefulSet", desired, extracted) {
				b.Fatal("the StatefulSet does not hold what was applied")
			}
		}
	})
}
