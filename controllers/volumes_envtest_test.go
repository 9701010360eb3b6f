package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// formedOn creates a StorageClass of its own that allows volume expansion or not, and a formed
// 3-member cluster with 1Gi volumes of it in a new namespace.
func (h *harness) formedOn(prefix string, expandable bool) (*kvv1.KVCluster, *storagev1.StorageClass, *memberSim) {
	h.t.Helper()
	ns := h.namespace(prefix)
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "disks-" + ns}, Provisioner: "example.com/disks",
		AllowVolumeExpansion: ptr.To(expandable)}
	if err := h.client.Create(context.Background(), class); err != nil {
		h.t.Fatalf("create StorageClass: %v", err)
	}
	h.t.Cleanup(func() { _ = h.client.Delete(context.Background(), class) })
	kvc := newKVCluster(ns, "kv", 3)
	kvc.Spec.Storage = kvv1.StorageSpec{Size: resource.MustParse("1Gi"), StorageClassName: class.Name}
	return kvc, class, h.formedCluster(kvc, "3.7.3")
}

// claimSizes are what each member's claim asks for and has, "asked/has".
func (h *harness) claimSizes(kvc *kvv1.KVCluster) []string {
	h.t.Helper()
	var out []string
	for ord := range int(kvc.Spec.Partitions) {
		var claim corev1.PersistentVolumeClaim
		h.get(&claim, kvc.Namespace, specs.DataClaimName(kvc, ord))
		asked, has := claim.Spec.Resources.Requests[corev1.ResourceStorage], claim.Status.Capacity[corev1.ResourceStorage]
		out = append(out, asked.String()+"/"+has.String())
	}
	return out
}

// expandVolumes plays the StorageClass's provisioner: every claim gets the size it asks for.
func (h *harness) expandVolumes(kvc *kvv1.KVCluster) {
	h.t.Helper()
	for ord := range int(kvc.Spec.Partitions) {
		var claim corev1.PersistentVolumeClaim
		h.get(&claim, kvc.Namespace, specs.DataClaimName(kvc, ord))
		claim.Status.Capacity = claim.Spec.Resources.Requests
		if err := h.client.Status().Update(context.Background(), &claim); err != nil {
			h.t.Fatalf("expand volume: %v", err)
		}
	}
}

// template is the quota the StatefulSet's template gives members, and the size its claims ask for.
func (h *harness) template(kvc *kvv1.KVCluster) (quota, claimSize string) {
	h.t.Helper()
	var sts appsv1.StatefulSet
	h.get(&sts, kvc.Namespace, kvc.Name)
	for _, arg := range sts.Spec.Template.Spec.Containers[0].Args {
		if q, ok := strings.CutPrefix(arg, "--quota-backend-bytes="); ok {
			quota = q
		}
	}
	size := sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage]
	return quota, size.String()
}

// TestGrowingStorageExpandsEveryClaim: storage.size grows 1Gi → 2Gi. The operator asks for 2Gi in
// every member's claim (the API server's resize admission checks the StorageClass allows it),
// keeps the StatefulSet's claim template (immutable) and the quota of the 1Gi volumes until every
// volume has 2Gi; then status.volumeSize records it and the quota follows, through a restart of
// every member.
func TestGrowingStorageExpandsEveryClaim(t *testing.T) {
	h := newHarness(t)
	kvc, _, sim := h.formedOn("grow", true)
	quota1Gi := fmt.Sprint(specs.QuotaBackendBytes(kvc, resource.MustParse("1Gi")))
	if got := h.fresh(kvc).Status.VolumeSize; got == nil || got.String() != "1Gi" {
		t.Errorf("status.volumeSize of a formed cluster = %v, want 1Gi", got)
	}

	h.setSpec(kvc, func(k *kvv1.KVCluster) { k.Spec.Storage.Size = resource.MustParse("2Gi") })
	h.reconcile(kvc)
	if got := strings.Join(h.claimSizes(kvc), " "); got != "2Gi/1Gi 2Gi/1Gi 2Gi/1Gi" {
		t.Errorf("claims (asked/has) = %s, want each asking for 2Gi", got)
	}
	if events := drainEvents(h); strings.Count(events, plan.EventVolumeExpansion) != 3 || !strings.Contains(events, "asked for 2Gi in volume claim data-kv-0 (was 1Gi)") {
		t.Errorf("want one %s event per claim, got:\n%s", plan.EventVolumeExpansion, events)
	}
	got := h.fresh(kvc)
	if c := meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionReconciling); got.Status.Phase != kvv1.PhaseUpgrading ||
		c == nil || c.Reason != plan.ReasonExpandingVolumes || !strings.Contains(c.Message, "data-kv-0 asks for 1Gi") {
		t.Errorf("while volumes grow: phase %s, Reconciling %+v; want Upgrading, ExpandingVolumes", got.Status.Phase, c)
	}
	if quota, size := h.template(kvc); quota != quota1Gi || size != "1Gi" {
		t.Errorf("while volumes grow the template has quota %s and claims of %s, want %s and the 1Gi it was made with", quota, size, quota1Gi)
	}
	h.reconcile(kvc)
	if calls := h.members.takeCalls(); len(calls) != 0 || len(sim.deleted()) != 0 {
		t.Errorf("nothing may restart before the volumes have grown: etcd calls %v, pods deleted %v", calls, sim.deleted())
	}
	if c := meta.FindStatusCondition(h.fresh(kvc).Status.Conditions, kvv1.ConditionReconciling); c == nil || !strings.Contains(c.Message, "data-kv-0 has 1Gi") {
		t.Errorf("Reconciling %+v while the volumes are expanded, want how far they are", c)
	}

	h.expandVolumes(kvc)
	h.reconcile(kvc)
	got = h.fresh(kvc)
	if got.Status.VolumeSize == nil || got.Status.VolumeSize.String() != "2Gi" {
		t.Errorf("status.volumeSize = %v once every volume has 2Gi", got.Status.VolumeSize)
	}
	if quota, size := h.template(kvc); quota != fmt.Sprint(specs.QuotaBackendBytes(kvc, resource.MustParse("2Gi"))) || size != "1Gi" {
		t.Errorf("once the volumes have grown the template has quota %s and claims of %s, want the default of 2Gi and still 1Gi", quota, size)
	}
	if events := drainEvents(h); !strings.Contains(events, plan.EventVolumesExpanded+" every member's volume has 2Gi now (was 1Gi): the backend quota goes from") {
		t.Errorf("want a %s event, got:\n%s", plan.EventVolumesExpanded, events)
	}
	var steps []string
	for i := 0; i < 20 && h.fresh(kvc).Status.Phase != kvv1.PhaseReady; i++ {
		steps = append(steps, sim.step()...)
	}
	if got := h.fresh(kvc); got.Status.Phase != kvv1.PhaseReady || strings.Count(strings.Join(steps, " "), "restart ") != 3 {
		t.Errorf("phase %s after steps %v, want Ready after each member restarted to take the new quota", got.Status.Phase, steps)
	}
}

// TestAStorageClassThatCannotExpandNeedsAPerson: growing storage on a StorageClass without
// allowVolumeExpansion leaves the claims alone and says what to do (Stalled, a Warning event).
// The growth can be undone (back to status.volumeSize, not below); once the class allows
// expansion, the claims are expanded.
func TestAStorageClassThatCannotExpandNeedsAPerson(t *testing.T) {
	h := newHarness(t)
	kvc, class, _ := h.formedOn("fixed", false)

	h.setSpec(kvc, func(k *kvv1.KVCluster) { k.Spec.Storage.Size = resource.MustParse("2Gi") })
	h.reconcile(kvc)
	got := h.fresh(kvc)
	stalled := meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionStalled)
	if got.Status.Phase != kvv1.PhaseFailed || stalled == nil || stalled.Reason != plan.ReasonVolumeExpansionUnsupported ||
		!strings.Contains(stalled.Message, "have StorageClass "+class.Name+", which does not allow volume expansion") {
		t.Errorf("phase %s, Stalled %+v; want Failed, %s", got.Status.Phase, stalled, plan.ReasonVolumeExpansionUnsupported)
	}
	if events := drainEvents(h); !strings.Contains(events, "Warning "+plan.ReasonVolumeExpansionUnsupported) {
		t.Errorf("want a Warning event, got:\n%s", events)
	}
	if got := strings.Join(h.claimSizes(kvc), " "); got != "1Gi/1Gi 1Gi/1Gi 1Gi/1Gi" {
		t.Errorf("claims (asked/has) = %s, want them left alone", got)
	}

	below := h.fresh(kvc)
	below.Spec.Storage.Size = resource.MustParse("512Mi")
	checkAdmission(t, h.client.Update(context.Background(), below), "spec.storage.size cannot shrink from 2Gi to 512Mi")
	h.setSpec(kvc, func(k *kvv1.KVCluster) { k.Spec.Storage.Size = resource.MustParse("1Gi") }) // what the volumes have
	h.reconcile(kvc)
	if got := h.fresh(kvc); got.Status.Phase != kvv1.PhaseReady {
		t.Errorf("phase %s once the growth was undone, want Ready", got.Status.Phase)
	}
	h.setSpec(kvc, func(k *kvv1.KVCluster) { k.Spec.Storage.Size = resource.MustParse("2Gi") })
	h.reconcile(kvc)
	drainEvents(h)

	class.AllowVolumeExpansion = ptr.To(true)
	if err := h.client.Update(context.Background(), class); err != nil {
		t.Fatal(err)
	}
	h.reconcile(kvc)
	if got := strings.Join(h.claimSizes(kvc), " "); got != "2Gi/1Gi 2Gi/1Gi 2Gi/1Gi" {
		t.Errorf("claims (asked/has) = %s once the class allows expansion, want each asking for 2Gi", got)
	}
	if got := h.fresh(kvc); got.Status.Phase != kvv1.PhaseUpgrading {
		t.Errorf("phase %s once the class allows expansion, want Upgrading", got.Status.Phase)
	}
}

// TestAdoptingGrownVolumesKeepsTheirSize: a new cluster adopts the claims of a deleted one of the
// same name whose volumes the operator grew, so the operator's field manager owns their size.
// Adopting applies the size with the label: an apply of the label alone would give the size up,
// which the API server refuses (a claim must ask for one), and every reconcile would fail.
func TestAdoptingGrownVolumesKeepsTheirSize(t *testing.T) {
	h := newHarness(t)
	old, class, _ := h.formedOn("adoptgrown", true)
	h.setSpec(old, func(k *kvv1.KVCluster) { k.Spec.Storage.Size = resource.MustParse("2Gi") })
	h.reconcile(old)
	h.expandVolumes(old)
	h.reconcile(old)
	if err := h.client.Delete(context.Background(), h.fresh(old)); err != nil {
		t.Fatal(err)
	}
	h.collectGarbage(old.Namespace)

	kvc := newKVCluster(old.Namespace, "kv", 3)
	kvc.Spec.Storage = kvv1.StorageSpec{Size: resource.MustParse("2Gi"), StorageClassName: class.Name}
	kvc.Annotations = map[string]string{kvv1.AnnotationAdoptVolumes: "true"}
	h.create(kvc)
	h.reconcile(kvc)
	if got := strings.Join(h.claimSizes(kvc), " "); got != "2Gi/2Gi 2Gi/2Gi 2Gi/2Gi" {
		t.Errorf("adopted claims (asked/has) = %s, want them as they were", got)
	}
	for ord := range 3 {
		var claim corev1.PersistentVolumeClaim
		h.get(&claim, kvc.Namespace, specs.DataClaimName(kvc, ord))
		if claim.Labels[specs.ClusterUIDLabel] != string(h.fresh(kvc).UID) {
			t.Errorf("claim %s is labelled for cluster %s, want the adopting one", claim.Name, claim.Labels[specs.ClusterUIDLabel])
		}
	}
	if got := h.fresh(kvc); got.Status.Phase != kvv1.PhaseCreating {
		t.Errorf("phase %s after adopting, want Creating", got.Status.Phase)
	}
}

// TestObservingADeletedClusterWithClaims: a deletion observes the member pods with an observation
// of its own; reading the claims into it panicked on a nil map (CI's e2e deletion of a cluster with
// a final backup hung on it).
func TestObservingADeletedClusterWithClaims(t *testing.T) {
	h := newHarness(t)
	kvc, _, _ := h.formedOn("observedeleted", true)
	obs := plan.Observation{Pods: map[int]plan.Pod{}}
	if err := h.r.observePods(context.Background(), h.fresh(kvc), &appsv1.StatefulSet{}, &obs); err != nil {
		t.Fatal(err)
	}
	if len(obs.Claims) != 3 {
		t.Errorf("claims observed: %v, want the 3 members'", obs.Claims)
	}
}
