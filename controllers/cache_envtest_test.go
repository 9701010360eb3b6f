package controllers

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// TestCacheDropsManagedFieldsOnlyOfWhatTheOperatorNeverCompares: the manager's cache keeps no
// managed fields of Pods, claims and Jobs, which the operator never compares with what it owns
// (they are much of a Pod's size, times three per cluster), and keeps its own of the objects it
// applies whole, which it does compare (without them every look at an idle cluster would write),
// and no one else's.
// (labelScoped, the other envtests' cache, drops the same, so their idle-write checks would catch
// a kind wrongly added to notComparedKinds.)
func TestCacheDropsManagedFieldsOnlyOfWhatTheOperatorNeverCompares(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, err := client.New(restConfig, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cache-"}}
	if err := admin.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	owned := metav1.ObjectMeta{Name: "c-0", Namespace: ns.Name, Labels: map[string]string{specs.ManagedByLabel: specs.ManagedByValue}}
	read := []client.Object{
		&corev1.Pod{ObjectMeta: owned, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "etcd"}}}},
		&corev1.PersistentVolumeClaim{ObjectMeta: owned, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}},
		&batchv1.Job{ObjectMeta: owned, Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "backup", Image: "operator"}}}}}},
	}
	applied := []client.Object{&corev1.ConfigMap{ObjectMeta: owned}, &corev1.Service{ObjectMeta: owned, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone}}}
	for _, o := range append(append([]client.Object{}, read...), applied...) {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		if len(o.GetManagedFields()) == 0 {
			t.Fatalf("the API server keeps no managed fields of %T", o)
		}
	}
	// The operator applies its part of them; the admin's (another manager's) stays beside it.
	for _, ac := range []runtime.ApplyConfiguration{corev1ac.ConfigMap(owned.Name, ns.Name).WithData(map[string]string{"members": "c-0"}),
		corev1ac.Service(owned.Name, ns.Name).WithSpec(corev1ac.ServiceSpec().WithPorts(corev1ac.ServicePort().WithName("client").WithPort(2379)))} {
		if err := admin.Apply(ctx, ac, client.FieldOwner(specs.FieldManager)); err != nil {
			t.Fatal(err)
		}
	}
	opts := CacheOptions()
	opts.Scheme = scheme
	cached, err := cache.New(operatorConfig, opts)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = cached.Start(ctx) }()
	get := func(o client.Object) client.Object {
		got := o.DeepCopyObject().(client.Object)
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return cached.Get(ctx, client.ObjectKeyFromObject(o), got) == nil, nil
		}); err != nil {
			t.Fatalf("%T not in the cache: %v", o, err)
		}
		return got
	}
	for _, o := range read {
		if mf := get(o).GetManagedFields(); len(mf) != 0 {
			t.Errorf("the cache keeps the managed fields of %T: %v", o, mf)
		}
	}
	for _, o := range applied {
		// The cache may hold the object as created, before the operator's apply: wait for both.
		var kept []metav1.ManagedFieldsEntry
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			kept = get(o).GetManagedFields()
			return slices.ContainsFunc(kept, func(e metav1.ManagedFieldsEntry) bool { return e.Manager == specs.FieldManager }), nil
		}); err != nil {
			t.Errorf("the cache keeps no managed fields of the operator's of %T, which it compares with what it owns: %v", o, kept)
		}
		if slices.ContainsFunc(kept, notOurs) {
			t.Errorf("the cache keeps another manager's managed fields of %T, which nothing reads: %v", o, kept)
		}
	}
}

// BenchmarkListOneCluster lists one cluster's pods out of the manager's cache when a thousand
// 3-member clusters share its namespace: through the label selector (matched against every pod
// of the namespace) and through clusterIndex (what observe does).
func BenchmarkListOneCluster(b *testing.B) {
	const clusters, members = 1000, 3
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, err := client.New(restConfig, client.Options{Scheme: scheme})
	if err != nil {
		b.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "list-"}}
	if err := admin.Create(ctx, ns); err != nil {
		b.Fatal(err)
	}
	names := make(chan int)
	errs := make(chan error, 8)
	for range cap(errs) {
		go func() {
			var err error
			for i := range names {
				if err != nil {
					continue
				}
				cluster := fmt.Sprintf("kv-%d", i/members)
				err = admin.Create(ctx, &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", cluster, i%members), Namespace: ns.Name,
						Labels: map[string]string{specs.ManagedByLabel: specs.ManagedByValue, specs.ClusterLabel: cluster}},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "etcd"}}}})
			}
			errs <- err
		}()
	}
	for i := range clusters * members {
		names <- i
	}
	close(names)
	for range cap(errs) {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	opts := CacheOptions(ns.Name)
	opts.Scheme = scheme
	cached, err := cache.New(operatorConfig, opts)
	if err != nil {
		b.Fatal(err)
	}
	if err := registerClusterIndex(ctx, cached); err != nil {
		b.Fatal(err)
	}
	go func() { _ = cached.Start(ctx) }()
	if !cached.WaitForCacheSync(ctx) {
		b.Fatal("the cache did not sync")
	}
	kvc := newKVCluster(ns.Name, "kv-500", members)
	for _, bc := range []struct {
		name      string
		selection client.ListOption
	}{
		{"label", client.MatchingLabels{specs.ClusterLabel: kvc.Name}},
		{"index", ofCluster(kvc)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				var pods corev1.PodList
				if err := cached.List(ctx, &pods, client.InNamespace(ns.Name), bc.selection); err != nil {
					b.Fatal(err)
				}
				if len(pods.Items) != members {
					b.Fatalf("listed %d pods, want %d", len(pods.Items), members)
				}
			}
		})
	}
}
