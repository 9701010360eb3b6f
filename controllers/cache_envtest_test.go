package controllers

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// TestCacheDropsManagedFieldsOnlyOfWhatTheOperatorNeverCompares: the manager's cache keeps no
// managed fields of Pods, claims and Jobs, which the operator never compares with what it owns
// (they are much of a Pod's size, times three per cluster), and keeps those of the objects it
// applies whole, which it does compare: without them every look at an idle cluster would write.
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
		if len(get(o).GetManagedFields()) == 0 {
			t.Errorf("the cache keeps no managed fields of %T, which the operator compares with what it owns", o)
		}
	}
}
