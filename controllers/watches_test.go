package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// TestMemberPodChanged: of a member pod's updates, only those that change what the operator reads
// from it start a reconcile.
func TestMemberPodChanged(t *testing.T) {
	running := func() *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "kv-0", Labels: map[string]string{appsv1.StatefulSetRevisionLabel: "kv-1"}},
			Status: corev1.PodStatus{
				Phase:      corev1.PodRunning,
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
				ContainerStatuses: []corev1.ContainerStatus{{Name: "etcd",
					State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}},
			},
		}
	}
	checkUpdates(t, memberPodChanged, running, []updateCase[*corev1.Pod]{
		{"nothing", func(*corev1.Pod) {}, false},
		{"an address assigned", func(p *corev1.Pod) { p.Status.PodIP = "10.0.0.7" }, false},
		{"another condition", func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue})
		}, false},
		{"an annotation", func(p *corev1.Pod) { p.Annotations = map[string]string{"note": "x"} }, false},
		{"not Ready", func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }, true},
		{"no longer running", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }, true},
		{"etcd restarted", func(p *corev1.Pod) { p.Status.ContainerStatuses[0].RestartCount++ }, true},
		{"etcd stopped", func(p *corev1.Pod) {
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{}}
		}, true},
		{"being deleted", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }, true},
		{"another revision", func(p *corev1.Pod) { p.Labels[appsv1.StatefulSetRevisionLabel] = "kv-2" }, true},
	})
}

// TestClusterChanged: a KVCluster's updates start a reconcile when its spec or the annotations
// people set change, not when only its status does, nor the digest of the status the operator
// owns that the cache keeps among its annotations (each of the operator's status writes changes
// it).
func TestClusterChanged(t *testing.T) {
	settled := func() *kvv1.KVCluster {
		kvc := newKVCluster("ns", "kv", 3)
		kvc.Generation, kvc.Annotations = 2, map[string]string{intentAnnotation: "digest-1"}
		kvc.Status.Phase = kvv1.PhaseReady
		return kvc
	}
	checkUpdates(t, clusterChanged, settled, []updateCase[*kvv1.KVCluster]{
		{"nothing", func(*kvv1.KVCluster) {}, false},
		{"its status written", func(k *kvv1.KVCluster) {
			k.Status.Phase, k.Annotations[intentAnnotation] = kvv1.PhaseUpgrading, "digest-2"
		}, false},
		{"its spec edited", func(k *kvv1.KVCluster) { k.Generation++ }, true},
		{"an annotation added", func(k *kvv1.KVCluster) { k.Annotations[kvv1.AnnotationBackupNow] = "token-1" }, true},
		{"the digest dropped", func(k *kvv1.KVCluster) { k.Annotations = nil }, false},
	})
	checkUpdates(t, clusterChanged, func() *kvv1.KVCluster {
		kvc := settled()
		kvc.Annotations[kvv1.AnnotationBackupNow] = "token-1"
		return kvc
	}, []updateCase[*kvv1.KVCluster]{
		{"its token changed", func(k *kvv1.KVCluster) { k.Annotations[kvv1.AnnotationBackupNow] = "token-2" }, true},
		{"its token removed", func(k *kvv1.KVCluster) { delete(k.Annotations, kvv1.AnnotationBackupNow) }, true},
	})
}

// TestStatefulSetChanged: a StatefulSet's updates start a reconcile when they change what the
// operator owns or reads, not when its controller counts pods.
func TestStatefulSetChanged(t *testing.T) {
	settled := func() *appsv1.StatefulSet {
		return &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Name: "kv", Generation: 2, Labels: map[string]string{"app": "kv"}},
			Status:     appsv1.StatefulSetStatus{ObservedGeneration: 2, UpdateRevision: "kv-1", Replicas: 3, ReadyReplicas: 3},
		}
	}
	checkUpdates(t, statefulSetChanged, settled, []updateCase[*appsv1.StatefulSet]{
		{"nothing", func(*appsv1.StatefulSet) {}, false},
		{"a pod less ready", func(s *appsv1.StatefulSet) { s.Status.ReadyReplicas, s.Status.AvailableReplicas = 2, 2 }, false},
		{"a pod more", func(s *appsv1.StatefulSet) { s.Status.Replicas = 4 }, false},
		{"its spec edited", func(s *appsv1.StatefulSet) { s.Generation++ }, true},
		{"a label edited", func(s *appsv1.StatefulSet) { s.Labels["app"] = "other" }, true},
		{"an annotation added", func(s *appsv1.StatefulSet) { s.Annotations = map[string]string{"note": "x"} }, true},
		{"an owner added", func(s *appsv1.StatefulSet) {
			s.OwnerReferences = []metav1.OwnerReference{{Name: "someone"}}
		}, true},
		{"being deleted", func(s *appsv1.StatefulSet) { s.DeletionTimestamp = &metav1.Time{} }, true},
		{"the new spec seen", func(s *appsv1.StatefulSet) { s.Status.ObservedGeneration = 3 }, true},
		{"a new revision", func(s *appsv1.StatefulSet) { s.Status.UpdateRevision = "kv-2" }, true},
	})
}

// TestOwnedPartChanged: a PodDisruptionBudget's updates start a reconcile when they change what
// the operator owns, not when its controller counts healthy pods.
func TestOwnedPartChanged(t *testing.T) {
	settled := func() *policyv1.PodDisruptionBudget {
		return &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: "kv", Generation: 1, Labels: map[string]string{"app": "kv"}},
			Status:     policyv1.PodDisruptionBudgetStatus{ObservedGeneration: 1, CurrentHealthy: 3, DesiredHealthy: 2, ExpectedPods: 3, DisruptionsAllowed: 1},
		}
	}
	checkUpdates(t, ownedPartChanged, settled, []updateCase[*policyv1.PodDisruptionBudget]{
		{"nothing", func(*policyv1.PodDisruptionBudget) {}, false},
		{"a pod less healthy", func(b *policyv1.PodDisruptionBudget) {
			b.Status.CurrentHealthy, b.Status.DisruptionsAllowed = 2, 0
		}, false},
		{"its spec edited", func(b *policyv1.PodDisruptionBudget) { b.Generation++ }, true},
		{"a label edited", func(b *policyv1.PodDisruptionBudget) { b.Labels["app"] = "other" }, true},
		{"an annotation added", func(b *policyv1.PodDisruptionBudget) { b.Annotations = map[string]string{"note": "x"} }, true},
		{"an owner added", func(b *policyv1.PodDisruptionBudget) {
			b.OwnerReferences = []metav1.OwnerReference{{Name: "someone"}}
		}, true},
		{"being deleted", func(b *policyv1.PodDisruptionBudget) { b.DeletionTimestamp = &metav1.Time{} }, true},
	})
}

// updateCase is an update of an object (change, applied to a fresh copy) and whether a predicate
// should let it start a reconcile.
type updateCase[T client.Object] struct {
	name   string
	change func(T)
	want   bool
}

func checkUpdates[T client.Object](t *testing.T, changed predicate.Predicate, fresh func() T, cases []updateCase[T]) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			updated := fresh()
			tc.change(updated)
			if got := changed.Update(event.UpdateEvent{ObjectOld: fresh(), ObjectNew: updated}); got != tc.want {
				t.Errorf("reconcile = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestMemberPodCluster: a member pod wakes its cluster; a Job's pod, or a pod without the
// cluster's label, none.
func TestMemberPodCluster(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   string
	}{
		{"a member pod", map[string]string{specs.ClusterLabel: "kv", appsv1.StatefulSetRevisionLabel: "kv-1"}, "[ns/kv]"},
		{"a backup Job's pod", map[string]string{specs.ClusterLabel: "kv", "batch.kubernetes.io/job-name": "kv-backup"}, "[]"},
		{"no cluster label", map[string]string{appsv1.StatefulSetRevisionLabel: "other-1"}, "[]"},
		{"no labels", nil, "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kv-0", Labels: tc.labels}}
			var got []string
			for _, r := range memberPodCluster(context.Background(), pod) {
				got = append(got, r.String())
			}
			if fmt.Sprint(got) != tc.want {
				t.Errorf("requests = %v, want %s", got, tc.want)
			}
		})
	}
}

// TestAMemberChangeGoesFirst: a cluster whose member pod changed is taken from the work queue
// before the work queued ahead of it, at memberChangePriority; one whose pods the operator lists as
// it starts, at the initial list's low priority.
func TestAMemberChangeGoesFirst(t *testing.T) {
	member := func(cluster string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: cluster + "-0",
			Labels: map[string]string{specs.ClusterLabel: cluster, appsv1.StatefulSetRevisionLabel: cluster + "-1"}}}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		event func(q workqueue.TypedRateLimitingInterface[reconcile.Request])
		want  string // the clusters as taken from the queue, with their priorities
	}{
		{"a member pod made", func(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			memberPodEvents.Create(ctx, event.CreateEvent{Object: member("changed")}, q)
		}, "changed@1 earlier@0"},
		{"a member pod changed", func(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			memberPodEvents.Update(ctx, event.UpdateEvent{ObjectOld: member("changed"), ObjectNew: member("changed")}, q)
		}, "changed@1 earlier@0"},
		{"a member pod gone", func(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			memberPodEvents.Delete(ctx, event.DeleteEvent{Object: member("changed")}, q)
		}, "changed@1 earlier@0"},
		{"a member pod listed as the operator starts", func(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			memberPodEvents.Create(ctx, event.CreateEvent{Object: member("changed"), IsInInitialList: true}, q)
		}, fmt.Sprintf("earlier@0 changed@%d", handler.LowPriority)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := priorityqueue.New[reconcile.Request]("test")
			defer q.ShutDown()
			q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Namespace: "ns", Name: "earlier"}}) // a new cluster, say
			tc.event(q)
			var taken []string
			for range 2 {
				req, priority, _ := q.GetWithPriority()
				taken = append(taken, fmt.Sprintf("%s@%d", req.Name, priority))
				q.Done(req)
			}
			if got := strings.Join(taken, " "); got != tc.want {
				t.Errorf("taken %s, want %s", got, tc.want)
			}
		})
	}
}
