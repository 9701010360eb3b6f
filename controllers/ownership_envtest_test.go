package controllers

import (
	"context"
	"fmt"
	"k8s.io/apimachinery/pkg/api/meta"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// blockedOn checks that the cluster is Failed for reason, naming want, with one Warning event.
func (h *harness) blockedOn(kvc *kvv1.KVCluster, reason string, want ...string) {
	h.t.Helper()
	got := h.fresh(kvc)
	stalled := meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionStalled)
	if got.Status.Phase != kvv1.PhaseFailed || stalled == nil || stalled.Reason != reason {
		h.t.Fatalf("phase %s, Stalled %+v; want Failed with reason %s", got.Status.Phase, stalled, reason)
	}
	for _, w := range want {
		if !strings.Contains(stalled.Message, w) {
			h.t.Errorf("Stalled message %q does not mention %q", stalled.Message, w)
		}
	}
	if ev := drainEvents(h); strings.Count(ev, "Warning "+reason) != 1 {
		h.t.Errorf("events = %q, want one Warning %s", ev, reason)
	}
}

func (h *harness) noStatefulSet(kvc *kvv1.KVCluster) {
	h.t.Helper()
	err := h.client.Get(context.Background(), client.ObjectKey{Namespace: kvc.Namespace, Name: kvc.Name}, &appsv1.StatefulSet{})
	if !apierrors.IsNotFound(err) {
		h.t.Errorf("a StatefulSet was written (%v): members would start", err)
	}
}

// TestObjectsItDoesNotOwnAreNeverWritten: an object under a name the operator derives that is not
// this KVCluster's (an unrelated Service, what an earlier KVCluster of the same name left while
// the garbage collector removes it) is reported and never written; once it is gone, the cluster
// starts.
func TestObjectsItDoesNotOwnAreNeverWritten(t *testing.T) {
	ctx := context.Background()
	t.Run("an unrelated Service named <name>-client", func(t *testing.T) {
		h := newHarness(t)
		ns := h.namespace("hijack")
		billing := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kv-client"},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "billing"}, Ports: []corev1.ServicePort{{Port: 80}}}}
		if err := h.client.Create(ctx, billing); err != nil {
			t.Fatal(err)
		}
		kvc := newKVCluster(ns, "kv", 3)
		h.create(kvc)
		h.members.set(members.Cluster{}, errNoQuorum)
		h.reconcile(kvc)

		var svc corev1.Service
		h.get(&svc, ns, "kv-client")
		if svc.Spec.Selector["app"] != "billing" || len(svc.Spec.Selector) != 1 || len(svc.OwnerReferences) != 0 {
			t.Errorf("the unrelated Service was taken over: selector %v, owners %v", svc.Spec.Selector, svc.OwnerReferences)
		}
		h.noStatefulSet(kvc)
		h.blockedOn(kvc, plan.ReasonObjectConflict, "Service kv-client", "not created by this KVCluster")
		h.assertIdle(kvc, "blocked on a conflict")

		if err := h.client.Delete(ctx, billing); err != nil {
			t.Fatal(err)
		}
		h.reconcile(kvc)
		if got := h.fresh(kvc); got.Status.Phase != kvv1.PhaseCreating {
			t.Errorf("after the conflict was resolved: phase %s, want Creating", got.Status.Phase)
		}
		h.get(&svc, ns, "kv-client")
		if !controlledBy(&svc, h.fresh(kvc)) {
			t.Errorf("kv-client is not the cluster's own now: %v", svc.OwnerReferences)
		}
	})

	t.Run("an earlier KVCluster's StatefulSet not yet collected", func(t *testing.T) {
		h := newHarness(t)
		ns := h.namespace("lingering")
		old := h.readyCluster(newKVCluster(ns, "kv", 1))
		if err := h.client.Delete(ctx, old); err != nil {
			t.Fatal(err)
		}
		kvc := newKVCluster(ns, "kv", 1)
		h.create(kvc)
		h.reconcile(kvc)
		var sts appsv1.StatefulSet
		h.get(&sts, ns, "kv")
		if ref := metav1.GetControllerOf(&sts); ref == nil || ref.UID != old.UID || len(sts.OwnerReferences) != 1 {
			t.Errorf("the earlier cluster's StatefulSet was written: owners %v", sts.OwnerReferences)
		}
		h.blockedOn(kvc, plan.ReasonObjectConflict, "StatefulSet kv", string(old.UID))

		h.collectGarbage(ns)
		h.reconcile(kvc)
		h.get(&sts, ns, "kv")
		if !controlledBy(&sts, h.fresh(kvc)) {
			t.Errorf("the new cluster did not start once the old objects were collected: owners %v", sts.OwnerReferences)
		}
	})
}

// TestLeftoverVolumesAreNeverStartedOnSilently: claims retained from a deleted cluster of the same
// name, or made by hand, stop a new cluster before any member starts on them; adopting them is an
// explicit choice, and never possible for a restore.
func TestLeftoverVolumesAreNeverStartedOnSilently(t *testing.T) {
	ctx := context.Background()
	t.Run("volumes of a deleted cluster of the same name", func(t *testing.T) {
		h := newHarness(t)
		ns := h.namespace("leftover")
		h.deletedLeavingVolumes(newKVCluster(ns, "kv", 3))

		kvc := newKVCluster(ns, "kv", 3)
		h.create(kvc)
		h.reconcile(kvc)
		h.noStatefulSet(kvc)
		h.blockedOn(kvc, plan.ReasonLeftoverVolumes, "data-kv-0, data-kv-1, data-kv-2", "kubectl delete pvc -n "+ns, kvv1.AnnotationAdoptVolumes)

		// Starting on that data is an explicit choice, which stays made once the annotation is gone.
		h.setAnnotation(kvc, kvv1.AnnotationAdoptVolumes, "true")
		h.reconcile(kvc)
		var sts appsv1.StatefulSet
		h.get(&sts, ns, "kv")
		if got := h.fresh(kvc); got.Status.Phase != kvv1.PhaseCreating {
			t.Errorf("after adopting the volumes: phase %s, want Creating", got.Status.Phase)
		}
		for i := range 3 {
			var claim corev1.PersistentVolumeClaim
			h.get(&claim, ns, fmt.Sprintf("data-kv-%d", i))
			if claim.Labels[specs.ClusterUIDLabel] != string(h.fresh(kvc).UID) {
				t.Errorf("adopted claim %s is labelled for cluster %s, want this one's", claim.Name, claim.Labels[specs.ClusterUIDLabel])
			}
		}
		h.setAnnotation(kvc, kvv1.AnnotationAdoptVolumes, "false")
		h.reconcile(kvc)
		if got := h.fresh(kvc); got.Status.Phase == kvv1.PhaseFailed {
			t.Errorf("the adopted volumes count as leftovers again once the annotation is gone: %+v", meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionStalled))
		}
	})

	t.Run("a claim made by hand before the cluster", func(t *testing.T) {
		h := newHarness(t)
		ns := h.namespace("byhand")
		claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data-kv-1"},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
		if err := h.client.Create(ctx, claim); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond) // creation timestamps have whole seconds
		kvc := newKVCluster(ns, "kv", 3)
		h.create(kvc)
		h.reconcile(kvc)
		h.noStatefulSet(kvc)
		h.blockedOn(kvc, plan.ReasonLeftoverVolumes, "data-kv-1")
	})

	t.Run("a restore never starts on existing data", func(t *testing.T) {
		h := newHarness(t)
		ns := h.namespace("restoreleft")
		h.deletedLeavingVolumes(newKVCluster(ns, "kv", 1))

		kvc := newKVCluster(ns, "kv", 1)
		kvc.Annotations = map[string]string{kvv1.AnnotationAdoptVolumes: "true"}
		kvc.Spec.Restore = &kvv1.RestoreSpec{PVC: &kvv1.PVCDestination{ClaimName: "backups"}, Key: "ns/kv/uid/kv-final-20261130T101500Z.db"}
		h.create(kvc)
		h.reconcile(kvc)
		h.noStatefulSet(kvc)
		h.blockedOn(kvc, plan.ReasonLeftoverVolumes, "data-kv-0", "instead of restoring ns/kv/uid/kv-final-20261130T101500Z.db")

		if err := h.client.Delete(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data-kv-0"}}); err != nil {
			t.Fatal(err)
		}
		h.reconcile(kvc)
		var sts appsv1.StatefulSet
		h.get(&sts, ns, "kv")
	})
}

// deletedLeavingVolumes forms a cluster, deletes it and collects its objects: its members' claims
// stay (whenDeleted: Retain), and its members are gone.
func (h *harness) deletedLeavingVolumes(kvc *kvv1.KVCluster) {
	h.t.Helper()
	h.formedCluster(kvc, "3.7.3")
	if err := h.client.Delete(context.Background(), h.fresh(kvc)); err != nil {
		h.t.Fatal(err)
	}
	h.collectGarbage(kvc.Namespace)
	h.members.set(members.Cluster{}, errNoQuorum)
}

func (h *harness) setAnnotation(kvc *kvv1.KVCluster, key, value string) {
	h.t.Helper()
	k := h.fresh(kvc)
	if k.Annotations == nil {
		k.Annotations = map[string]string{}
	}
	k.Annotations[key] = value
	if err := h.client.Update(context.Background(), k); err != nil {
		h.t.Fatal(err)
	}
}
