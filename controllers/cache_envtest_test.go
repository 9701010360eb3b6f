package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1ac "github.com/kvcluster/kvcluster-operator/apis/applyconfiguration/apis/v1alpha1"
	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// TestCacheKeepsNoManagedFieldsButTheDigestOfTheOperatorsIntent: the manager's cache keeps no
// managed fields of Pods, claims and Jobs, which the operator never compares with what it owns
// (they are much of a Pod's size, times three per cluster), nor of the objects it applies whole,
// which it does compare (without them every look at an idle cluster would write): of those, it
// keeps the digest of the operator's part (cachedIntent), which holds what the operator applied
// beside another manager's fields.
// (labelScoped, the other envtests' cache, keeps the same forms, so their idle-write checks would
// catch a kind wrongly added to notComparedKinds.)
func TestCacheKeepsNoManagedFieldsButTheDigestOfTheOperatorsIntent(t *testing.T) {
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
	// (Afresh each time: Apply decodes the API server's answer into its argument.)
	intents := func() []runtime.ApplyConfiguration {
		return []runtime.ApplyConfiguration{corev1ac.ConfigMap(owned.Name, ns.Name).WithData(map[string]string{"members": "c-0"}),
			corev1ac.Service(owned.Name, ns.Name).WithSpec(corev1ac.ServiceSpec().WithPorts(
				corev1ac.ServicePort().WithName("client").WithPort(2379).WithProtocol(corev1.ProtocolTCP).WithTargetPort(intstr.FromInt32(2379))))}
	}
	for _, ac := range intents() {
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
	for i, o := range applied {
		// The cache may hold the object as created, before the operator's apply: wait for it.
		var cached client.Object
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			cached = get(o)
			return holdsIntent(cached, intents()[i]), nil
		}); err != nil {
			t.Errorf("%T in the cache does not hold what the operator applied: %v", o, cached)
		}
		if mf := cached.GetManagedFields(); len(mf) != 0 {
			t.Errorf("the cache keeps the managed fields of %T: %v", o, mf)
		}
	}
}

// TestCachedIntentHoldsWhatTheOperatorApplies: of every object the operator applies, as specs
// builds it and the API server stores it, the digest the manager's cache keeps (cachedIntent)
// says the object holds that intent, as Extract and compare of its managed fields say, so an idle cluster
// is not written; still beside another manager's field; and no longer once another manager has
// taken over one of the operator's fields (which the operator then puts back).
func TestCachedIntentHoldsWhatTheOperatorApplies(t *testing.T) {
	ctx := context.Background()
	admin, err := client.New(restConfig, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "intent-"}}
	if err := admin.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	kvc := newKVCluster(ns.Name, "kv", 3)
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	kvc.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{Mode: kvv1.NetworkPolicyManaged, ClientsFrom: []networkingv1.NetworkPolicyPeer{
		{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}}
	if err := admin.Create(ctx, kvc); err != nil {
		t.Fatal(err)
	}
	opts := CacheOptions(ns.Name)
	opts.Scheme = scheme
	informers, err := cache.New(operatorConfig, opts)
	if err != nil {
		t.Fatal(err)
	}
	cacheCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = informers.Start(cacheCtx) }()
	certificate := map[string][]byte{corev1.TLSCertKey: []byte("cert"), corev1.TLSPrivateKeyKey: []byte("key"), specs.CACertKey: []byte("ca")}
	operator := specs.OperatorPods{Namespace: "kvcluster-system", Labels: map[string]string{"app.kubernetes.io/name": "kvcluster-operator"}}
	for _, tc := range []struct {
		current client.Object
		intent  func() runtime.ApplyConfiguration // afresh each time: Apply decodes the answer into it
	}{
		{&appsv1.StatefulSet{}, func() runtime.ApplyConfiguration {
			return specs.StatefulSet(kvc, specs.MemberSet{Replicas: 3, Images: specs.Images{EtcdRepository: "registry.k8s.io/etcd"}})
		}},
		{&corev1.Service{}, func() runtime.ApplyConfiguration { return specs.PeerService(kvc, "") }},
		{&corev1.Service{}, func() runtime.ApplyConfiguration { return specs.ClientService(kvc, time.Time{}) }},
		{&policyv1.PodDisruptionBudget{}, func() runtime.ApplyConfiguration { return specs.PodDisruptionBudget(kvc, 3) }},
		{&corev1.ConfigMap{}, func() runtime.ApplyConfiguration {
			return specs.MembershipConfigMap(kvc, specs.Membership{State: "new", Ordinals: []int{0, 1, 2}}, "")
		}},
		{&networkingv1.NetworkPolicy{}, func() runtime.ApplyConfiguration { return specs.NetworkPolicy(kvc, operator, "") }},
		{&corev1.Secret{}, func() runtime.ApplyConfiguration { return specs.TLSSecret(kvc, specs.TLSServer, certificate, "") }},
		{&corev1.ConfigMap{}, func() runtime.ApplyConfiguration { return specs.Guard(kvc) }},
	} {
		name := *tc.intent().(interface{ GetName() *string }).GetName()
		t.Run(fmt.Sprintf("%T %s", tc.current, name), func(t *testing.T) {
			if err := admin.Apply(ctx, tc.intent(), client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
				t.Fatal(err)
			}
			key := client.ObjectKey{Namespace: ns.Name, Name: name}
			check := func(when string, want bool) {
				t.Helper()
				live := tc.current.DeepCopyObject().(client.Object)
				if err := admin.Get(ctx, key, live); err != nil {
					t.Fatal(err)
				}
				owned, err := ownedIntent(live)
				if err != nil {
					t.Fatal(err)
				}
				if compared := equality.Semantic.DeepEqual(owned, tc.intent()); compared != want {
					t.Fatalf("%s: Extract and compare say it holds the intent: %v, want %v", when, compared, want)
				}
				// The manager's cache, once it holds this version.
				cached := tc.current.DeepCopyObject().(client.Object)
				if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
					return informers.Get(ctx, key, cached) == nil && cached.GetResourceVersion() == live.GetResourceVersion(), nil
				}); err != nil {
					t.Fatalf("%s: the cache does not hold version %s: %v", when, live.GetResourceVersion(), err)
				}
				if len(cached.GetManagedFields()) != 0 || cached.GetAnnotations()[intentAnnotation] == "" {
					t.Errorf("%s: the cache keeps managed fields, not the digest: %v", when, cached)
				}
				if got := holdsIntent(cached, tc.intent()); got != want {
					t.Errorf("%s: as cached, holds the intent: %v, want %v", when, got, want)
				}
				if got := holdsIntent(live, tc.intent()); got != want {
					t.Errorf("%s: as read from the API server, holds the intent: %v, want %v", when, got, want)
				}
			}
			check("as applied", true)
			patch := func(manager, data string) {
				t.Helper()
				obj := tc.current.DeepCopyObject().(client.Object)
				obj.SetNamespace(ns.Name)
				obj.SetName(name)
				if err := admin.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(data)), client.FieldOwner(manager)); err != nil {
					t.Fatal(err)
				}
			}
			patch("kubectl-annotate", `{"metadata":{"annotations":{"team.example/owner":"storage"}}}`)
			check("beside another manager's annotation", true)
			patch("kubectl-edit", `{"metadata":{"labels":{"`+specs.ClusterLabel+`":"other"}}}`)
			check("with one of its labels taken over", false)
		})
	}
	// Of the KVCluster, the status the operator applies (applyStatus).
	t.Run("KVCluster status", func(t *testing.T) {
		statusOf := func(phase kvv1.Phase) *kvv1ac.KVClusterStatusApplyConfiguration {
			st, err := statusApplyConfiguration(kvv1.KVClusterStatus{Phase: phase, ReadyPartitions: 3, CurrentVersion: "3.7.3",
				Members:    []kvv1.MemberStatus{{Name: "kv-0", DBSize: new(resource.MustParse("40Mi"))}},
				Conditions: []metav1.Condition{{Type: kvv1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.Now()}}})
			if err != nil {
				t.Fatal(err)
			}
			return st
		}
		ready := statusOf(kvv1.PhaseReady)
		key := client.ObjectKeyFromObject(kvc)
		check := func(when string, want bool) {
			t.Helper()
			var live, cached kvv1.KVCluster
			if err := admin.Get(ctx, key, &live); err != nil {
				t.Fatal(err)
			}
			if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				return informers.Get(ctx, key, &cached) == nil && cached.ResourceVersion == live.ResourceVersion, nil
			}); err != nil {
				t.Fatalf("%s: the cache does not hold version %s: %v", when, live.ResourceVersion, err)
			}
			if len(cached.ManagedFields) != 0 || cached.Annotations[intentAnnotation] == "" {
				t.Errorf("%s: the cache keeps managed fields, not the digest: %v", when, cached.ObjectMeta)
			}
			if got := holdsIntent(&cached, ready); got != want {
				t.Errorf("%s: as cached, holds the status: %v, want %v", when, got, want)
			}
			if got := holdsIntent(&live, ready); got != want {
				t.Errorf("%s: as read from the API server, holds the status: %v, want %v", when, got, want)
			}
			if holdsIntent(&cached, statusOf(kvv1.PhaseUpgrading)) {
				t.Errorf("%s: as cached, holds another status", when)
			}
		}
		check("before the operator wrote any", false)
		if err := admin.Status().Apply(ctx, kvv1ac.KVCluster(kvc.Name, kvc.Namespace).WithStatus(ready),
			client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
			t.Fatal(err)
		}
		check("as applied", true)
		if err := admin.Patch(ctx, &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Namespace: kvc.Namespace, Name: kvc.Name}},
			client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"team.example/owner":"storage"}}}`)), client.FieldOwner("kubectl-annotate")); err != nil {
			t.Fatal(err)
		}
		check("beside another manager's annotation", true)
		if err := admin.Status().Patch(ctx, &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Namespace: kvc.Namespace, Name: kvc.Name}},
			client.RawPatch(types.MergePatchType, []byte(`{"status":{"phase":"Failed"}}`)), client.FieldOwner("kubectl-edit")); err != nil {
			t.Fatal(err)
		}
		check("with its phase taken over", false)
	})
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
