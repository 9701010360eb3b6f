package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// Verdict reasons for objects the operator needs but may not touch.
const (
	ReasonObjectConflict  = "ObjectConflict"
	ReasonLeftoverVolumes = "LeftoverVolumes"
	ReasonApplyRejected   = "ApplyRejected"
)

// blockingReasons are the verdicts of blockedVerdict: they end by themselves once the cause is gone.
var blockingReasons = map[string]bool{ReasonObjectConflict: true, ReasonLeftoverVolumes: true, ReasonApplyRejected: true}

// lookup reads an object from the cache and, when the cache lacks it, from the API server: the
// cache holds only objects labelled as the operator's, so an object someone else created under a
// name the operator derives would otherwise look absent and be taken over by the next apply.
func (r *KVClusterReconciler) lookup(ctx context.Context, key client.ObjectKey, obj client.Object) (bool, error) {
	err := r.Client.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		err = r.APIReader.Get(ctx, key, obj)
	}
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("get %T %s: %w", obj, key, err)
}

// controlledBy reports whether this incarnation of the KVCluster controls obj.
func controlledBy(obj metav1.Object, kvc *kvv1.KVCluster) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == kvc.UID
}

// foreignChildren lists the objects the cluster would own that exist and belong to someone else:
// an unrelated Service named <name>-client, or what an earlier KVCluster of the same name left
// while the garbage collector removes it. None of them may be written.
// stsForeign says the StatefulSet is among them: what answers at the members' names is then
// someone else's, and is never backed up.
func (r *KVClusterReconciler) foreignChildren(ctx context.Context, kvc *kvv1.KVCluster) (foreign []string, stsForeign bool, err error) {
	children := []struct {
		kind, name string
		obj        client.Object
	}{
		{"Service", specs.PeerServiceName(kvc), &corev1.Service{}},
		{"Service", specs.ClientServiceName(kvc), &corev1.Service{}},
		{"PodDisruptionBudget", kvc.Name, &policyv1.PodDisruptionBudget{}},
		{"ConfigMap", specs.MembershipConfigMapName(kvc), &corev1.ConfigMap{}},
		{"StatefulSet", kvc.Name, &appsv1.StatefulSet{}},
	}
	var guard corev1.ConfigMap // owned by no one on purpose: it names its cluster by UID
	// Only the cache is asked: a guard always carries the operator's labels.
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.GuardName(kvc)}, &guard); client.IgnoreNotFound(err) != nil {
		return nil, false, err
	} else if err == nil && guard.Labels[specs.ClusterUIDLabel] != string(kvc.UID) {
		foreign = append(foreign, "ConfigMap "+guard.Name+" (the deletion guard of another KVCluster, uid "+guard.Labels[specs.ClusterUIDLabel]+")")
	}
	for _, c := range children {
		found, err := r.lookup(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: c.name}, c.obj)
		if err != nil {
			return nil, false, err
		}
		if found && !controlledBy(c.obj, kvc) {
			foreign = append(foreign, c.kind+" "+c.name+" ("+ownerOf(c.obj)+")")
			stsForeign = stsForeign || c.kind == "StatefulSet"
		}
	}
	return foreign, stsForeign, nil
}

func ownerOf(obj metav1.Object) string {
	if ref := metav1.GetControllerOf(obj); ref != nil {
		return fmt.Sprintf("controlled by %s %s, uid %s", ref.Kind, ref.Name, ref.UID)
	}
	return "not created by this KVCluster"
}

// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=patch

// leftoverClaims lists the data claims, among those of every member the cluster has or may get,
// that exist and were not made for this KVCluster: volumes retained from an earlier cluster of
// the same name, or created by hand. The StatefulSet would adopt them and its members would start
// on their data (a restore would be skipped, since the member has data).
//
// Adopted (kvcluster.io/adopt-volumes, never with a restore), they are labelled with this
// cluster's UID, so they stay its own once the annotation is gone.
func (r *KVClusterReconciler) leftoverClaims(ctx context.Context, kvc *kvv1.KVCluster, obs observation) ([]string, error) {
	adopt := kvc.Annotations[kvv1.AnnotationAdoptVolumes] == "true" && kvc.Spec.Restore == nil
	n := int(kvc.Spec.Partitions)
	if obs.stsReplicas != nil {
		n = max(n, int(*obs.stsReplicas))
	}
	for _, m := range kvc.Status.Members {
		if ord, ok := specs.OrdinalOfMember(kvc, m.Name); ok {
			n = max(n, ord+1)
		}
	}
	var leftover []string
	for ord := range n {
		var claim corev1.PersistentVolumeClaim
		found, err := r.lookup(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.DataClaimName(kvc, ord)}, &claim)
		if err != nil {
			return nil, err
		}
		// A claim being deleted is no risk: no new pod may use it, and the StatefulSet makes a new one.
		if found && claim.DeletionTimestamp == nil && !claimBelongs(kvc, &claim) {
			leftover = append(leftover, claim.Name)
		}
	}
	if !adopt {
		return leftover, nil
	}
	for _, name := range leftover {
		mine := corev1ac.PersistentVolumeClaim(name, kvc.Namespace).WithLabels(map[string]string{specs.ClusterUIDLabel: string(kvc.UID)})
		if err := r.Client.Apply(ctx, mine, client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
			return nil, fmt.Errorf("adopt volume claim %s/%s: %w", kvc.Namespace, name, err)
		}
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, "VolumeAdopted", "Adopt",
			"adopted volume claim %s (%s=true): its member starts on the data it holds", name, kvv1.AnnotationAdoptVolumes)
	}
	return nil, nil
}

// claimBelongs: a member of this cluster was seen healthy on the claim; or the claim carries this
// cluster's UID (claims of StatefulSets from this release on do); or, unlabelled (made by an
// earlier release, or by hand), it was created after this cluster was.
func claimBelongs(kvc *kvv1.KVCluster, claim *corev1.PersistentVolumeClaim) bool {
	if slices.ContainsFunc(kvc.Status.Members, func(m kvv1.MemberStatus) bool { return m.VolumeUID == string(claim.UID) }) {
		return true
	}
	if uid, ok := claim.Labels[specs.ClusterUIDLabel]; ok {
		return uid == string(kvc.UID)
	}
	return !claim.CreationTimestamp.Before(&kvc.CreationTimestamp)
}

// conflicted: the cluster needs objects that are someone else's; nothing is written but status.
func (o observation) conflicted() bool {
	return len(o.foreignChildren) > 0 || len(o.leftoverClaims) > 0
}

// blockedVerdict stops a cluster that needs objects it may not write, saying what to do.
func blockedVerdict(kvc *kvv1.KVCluster, obs observation) (verdict, bool) {
	switch {
	case len(obs.foreignChildren) > 0:
		return verdict{kvv1.PhaseFailed, ReasonObjectConflict, fmt.Sprintf(
			"objects this cluster needs exist and belong to someone else, so nothing is written: %s. "+
				"Rename or delete them (an earlier KVCluster's are removed by the garbage collector shortly), or choose another name for this KVCluster",
			strings.Join(obs.foreignChildren, "; ")), pollWhileFailed}, true
	case len(obs.leftoverClaims) > 0 && kvc.Spec.Restore != nil:
		return verdict{kvv1.PhaseFailed, ReasonLeftoverVolumes, fmt.Sprintf(
			"volume claims %s already exist and were not made for this KVCluster (an earlier cluster of the same name, or created by hand): "+
				"its members would start on their data instead of restoring %s. Delete them (kubectl delete pvc -n %s %s) to restore into new volumes",
			strings.Join(obs.leftoverClaims, ", "), kvc.Spec.Restore.Key, kvc.Namespace, strings.Join(obs.leftoverClaims, " ")), pollWhileFailed}, true
	case len(obs.leftoverClaims) > 0:
		return verdict{kvv1.PhaseFailed, ReasonLeftoverVolumes, fmt.Sprintf(
			"volume claims %s already exist and were not made for this KVCluster (an earlier cluster of the same name, or created by hand): "+
				"its members would silently start on their data. Delete them (kubectl delete pvc -n %s %s) to start empty, "+
				"or annotate the KVCluster %s=true to start on that data",
			strings.Join(obs.leftoverClaims, ", "), kvc.Namespace, strings.Join(obs.leftoverClaims, " "), kvv1.AnnotationAdoptVolumes), pollWhileFailed}, true
	case obs.applyRejected != "":
		return verdict{kvv1.PhaseFailed, ReasonApplyRejected, "the API server refused to apply this cluster's objects: " + obs.applyRejected +
			". Fix the cause (an admission policy, a quota, the operator's permissions) or the spec; the operator retries", pollWhileFailed}, true
	}
	return verdict{}, false
}
