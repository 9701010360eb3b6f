package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// TestACacheIsBehindOnlyUntilItShowsTheOperatorsWrite: a KVCluster read is behind when it is an
// older version of the same object than the operator's last status write made, for cacheLagLimit
// at most; once a read is not, the write is forgotten (a later read cannot go back before it).
func TestACacheIsBehindOnlyUntilItShowsTheOperatorsWrite(t *testing.T) {
	cluster := func(uid types.UID, version string) *kvv1.KVCluster {
		kvc := newKVCluster("ns", "kv", 3)
		kvc.UID, kvc.ResourceVersion = uid, version
		return kvc
	}
	written := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	type read struct {
		kvc    *kvv1.KVCluster
		after  time.Duration // since the write
		behind bool
	}
	for _, tc := range []struct {
		name  string
		write bool // at resource version 20 of UID a
		reads []read
	}{
		{"nothing written: never behind", false, []read{{cluster("a", "10"), 0, false}}},
		{"an older version is, until a read shows the write", true, []read{
			{cluster("a", "10"), 0, true}, {cluster("a", "19"), time.Second, true}, {cluster("a", "20"), time.Second, false},
			{cluster("a", "10"), time.Second, false}}},
		{"a newer version (another's write after ours) is not", true, []read{{cluster("a", "25"), 0, false}}},
		{"another object of the name (re-created) is not", true, []read{{cluster("b", "10"), 0, false}}},
		{"an older version past cacheLagLimit is not", true, []read{
			{cluster("a", "10"), cacheLagLimit - time.Millisecond, true}, {cluster("a", "10"), cacheLagLimit, false}}},
		{"a version that cannot be ordered is not", true, []read{{cluster("a", "x1"), 0, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h statusWrites
			if tc.write {
				h.wrote(cluster("a", "10"), "20", written)
			}
			for i, r := range tc.reads {
				if got := h.behind(r.kvc, written.Add(r.after)); got != r.behind {
					t.Errorf("read %d (UID %s, version %s, %s after the write): behind %v, want %v", i, r.kvc.UID, r.kvc.ResourceVersion, r.after, got, r.behind)
				}
			}
		})
	}
	var h statusWrites
	h.wrote(cluster("a", "10"), "20", written)
	h.forget(types.NamespacedName{Namespace: "ns", Name: "kv"})
	if h.behind(cluster("a", "10"), written) {
		t.Error("a forgotten cluster is still taken as behind")
	}
}

// TestCachedIntent: of an object the operator applies, the cache keeps no managed fields but the
// digest of what the operator owns, from which the same answer comes out as from the managed
// fields: holds what the operator applied, not another intent. An object without managed fields
// is left as it is (the informer may transform an object twice).
func TestCachedIntent(t *testing.T) {
	ours := metav1.ManagedFieldsEntry{Manager: specs.FieldManager, Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1",
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:data":{"f:members":{}},"f:metadata":{"f:labels":{"f:app":{}}}}`)}}
	theirs := metav1.ManagedFieldsEntry{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:data":{"f:other":{}},"f:metadata":{"f:annotations":{"f:note":{}}}}`)}}
	applied := corev1ac.ConfigMap("kv-members", "ns").WithLabels(map[string]string{"app": "kv"}).WithData(map[string]string{"members": "kv-0"})
	other := corev1ac.ConfigMap("kv-members", "ns").WithLabels(map[string]string{"app": "kv"}).WithData(map[string]string{"members": "kv-0,kv-1"})
	for _, tc := range []struct {
		name   string
		fields []metav1.ManagedFieldsEntry
		holds  bool // holds what the operator applied
	}{
		{"ours alone", []metav1.ManagedFieldsEntry{ours}, true},
		{"ours beside another manager's", []metav1.ManagedFieldsEntry{theirs, ours}, true},
		{"another manager's alone", []metav1.ManagedFieldsEntry{theirs}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kv-members", Namespace: "ns", Labels: map[string]string{"app": "kv"},
				Annotations: map[string]string{"note": "x"}, ManagedFields: tc.fields},
				Data: map[string]string{"members": "kv-0", "other": "x"}}
			before := cm.DeepCopy()
			after := cachedIntent(cm).(*corev1.ConfigMap)
			if after.ManagedFields != nil {
				t.Errorf("the cache keeps managed fields: %+v", after.ManagedFields)
			}
			for _, read := range []struct {
				name string
				obj  *corev1.ConfigMap
			}{{"as the API server gives it", before}, {"as the cache keeps it", after}} {
				if got := holdsIntent(read.obj, applied); got != tc.holds {
					t.Errorf("%s: holds what the operator applied = %v, want %v", read.name, got, tc.holds)
				}
				if holdsIntent(read.obj, other) {
					t.Errorf("%s: holds another intent", read.name)
				}
			}
			if again := cachedIntent(after.DeepCopy()); !equality.Semantic.DeepEqual(again, after) {
				t.Errorf("cached form of the cached form = %+v, want %+v", again, after)
			}
			delete(after.Annotations, intentAnnotation)
			before.ManagedFields = nil
			if !equality.Semantic.DeepEqual(after, before) {
				t.Errorf("object = %+v, want %+v", after, before)
			}
		})
	}
	// An annotation set on the object itself is never taken for the digest: it is replaced as the
	// cache stores the object; and on an object the cache leaves alone (no managed fields) it
	// cannot be a digest of this process.
	digest, err := intentDigest(applied)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(applied)
	if err != nil {
		t.Fatal(err)
	}
	plain := sha256.Sum256(data)
	for _, tc := range []struct {
		name     string
		spoofed  string
		managers []metav1.ManagedFieldsEntry
	}{
		{"this process's digest, beside another manager's fields", digest, []metav1.ManagedFieldsEntry{theirs}},
		{"the intent's SHA-256, without managed fields", hex.EncodeToString(plain[:]), nil},
	} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kv-members", Namespace: "ns", Labels: map[string]string{"app": "kv"},
			Annotations: map[string]string{intentAnnotation: tc.spoofed}, ManagedFields: tc.managers},
			Data: map[string]string{"members": "kv-0"}}
		if holdsIntent(cachedIntent(cm).(client.Object), applied) {
			t.Errorf("an object annotated with %s holds what the operator applied", tc.name)
		}
	}
	bare := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kv-members", Namespace: "ns"}}
	if got := cachedIntent(bare.DeepCopy()); !equality.Semantic.DeepEqual(got, bare) {
		t.Errorf("an object without managed fields became %+v", got)
	}
	if holdsIntent(bare, applied) {
		t.Error("an object of no manager holds what the operator applied")
	}
}

// BenchmarkComparingTheStatefulSet: what applyOwned spends on an unchanged StatefulSet of a TLS
// cluster: Extract and compare, as it did on the object as the API server stored it, and the
// digest the cache keeps instead (cachedIntent).
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
	b.Run("cached", func(b *testing.B) {
		cached := cachedIntent(current.DeepCopy()).(*appsv1.StatefulSet)
		for b.Loop() {
			if !holdsIntent(cached, desired) {
				b.Fatal("the StatefulSet does not hold what was applied")
			}
		}
	})
}
