package specs

import (
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// GuardLabel marks a cluster's deletion guard.
const GuardLabel = "kvcluster.io/deletion-guard"

// OrphanedAnnotation on a guard: its KVCluster was deleted with --cascade=orphan, and the guard
// keeps owning the members left running. Deleting it removes them.
const OrphanedAnnotation = "kvcluster.io/orphaned-members"

// GuardName is the ConfigMap that keeps a cluster's members while its deletion steps run.
func GuardName(kvc *kvv1.KVCluster) string { return GuardNameOf(kvc.Name) }

// GuardNameOf is GuardName of the KVCluster of that name (which may be gone).
func GuardNameOf(cluster string) string { return cluster + "-guard" }

// Guard exists while a cluster has deletion steps (a final backup, a deregistration), and is a
// second owner of what those steps need: the StatefulSet (so the members), the peer Service
// (their names), the membership ConfigMap and the steps' Jobs. The garbage collector never
// deletes an object that still has an owner: when the KVCluster is deleted with foreground
// propagation (Argo CD's default for prunes), it only drops the KVCluster from their owners,
// instead of deleting the members before the final backup has read them. The guard has no owner
// itself; the operator deletes it once the deletion steps ran, and the garbage collector then
// removes the rest.
func Guard(kvc *kvv1.KVCluster) *corev1ac.ConfigMapApplyConfiguration {
	labels := Labels(kvc)
	labels[GuardLabel] = "true"
	labels[ClusterUIDLabel] = string(kvc.UID)
	return corev1ac.ConfigMap(GuardName(kvc), kvc.Namespace).
		WithLabels(labels).
		WithAnnotations(map[string]string{"kvcluster.io/purpose": "keeps the members of KVCluster " + kvc.Name +
			" until its final backup and deregistration ran on deletion; the operator deletes it then"})
}

// Owners are the owner references of a cluster's objects: the KVCluster (their controller) and,
// for what the deletion steps need, the guard while it exists (guard is its UID, or empty).
func Owners(kvc *kvv1.KVCluster, guard types.UID) []*metav1ac.OwnerReferenceApplyConfiguration {
	refs := []*metav1ac.OwnerReferenceApplyConfiguration{OwnerReference(kvc)}
	if guard != "" {
		refs = append(refs, metav1ac.OwnerReference().WithAPIVersion("v1").WithKind("ConfigMap").
			WithName(GuardName(kvc)).WithUID(guard))
	}
	return refs
}
