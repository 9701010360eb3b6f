package plan

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// blockedVerdict stops a cluster that needs objects it may not write, saying what to do.
func blockedVerdict(kvc *kvv1.KVCluster, obs Observation) (verdict, bool) {
	switch {
	case len(obs.ForeignChildren) > 0:
		return verdict{kvv1.PhaseFailed, ReasonObjectConflict, fmt.Sprintf(
			"objects this cluster needs exist and belong to someone else, so nothing is written: %s. "+
				"Rename or delete them (an earlier KVCluster's are removed by the garbage collector shortly), or choose another name for this KVCluster",
			strings.Join(obs.ForeignChildren, "; ")), pollWhileFailed}, true
	case len(obs.LeftoverClaims) > 0 && kvc.Spec.Restore != nil:
		return verdict{kvv1.PhaseFailed, ReasonLeftoverVolumes, fmt.Sprintf(
			"volume claims %s already exist and were not made for this KVCluster (an earlier cluster of the same name, or created by hand): "+
				"its members would start on their data instead of restoring %s. Delete them (kubectl delete pvc -n %s %s) to restore into new volumes",
			strings.Join(obs.LeftoverClaims, ", "), kvc.Spec.Restore.Key, kvc.Namespace, strings.Join(obs.LeftoverClaims, " ")), pollWhileFailed}, true
	case len(obs.LeftoverClaims) > 0:
		return verdict{kvv1.PhaseFailed, ReasonLeftoverVolumes, fmt.Sprintf(
			"volume claims %s already exist and were not made for this KVCluster (an earlier cluster of the same name, or created by hand): "+
				"its members would silently start on their data. Delete them (kubectl delete pvc -n %s %s) to start empty, "+
				"or annotate the KVCluster %s=true to start on that data",
			strings.Join(obs.LeftoverClaims, ", "), kvc.Namespace, strings.Join(obs.LeftoverClaims, " "), kvv1.AnnotationAdoptVolumes), pollWhileFailed}, true
	case obs.tlsProblem != "":
		return verdict{kvv1.PhaseFailed, ReasonTLSInvalid, "the cluster's TLS certificates cannot be used, so nothing is written: " +
			obs.tlsProblem, pollWhileFailed}, true
	case obs.ApplyRejected != "":
		return verdict{kvv1.PhaseFailed, ReasonApplyRejected, "the API server refused to apply this cluster's objects: " + obs.ApplyRejected +
			". Fix the cause (an admission policy, a quota, the operator's permissions) or the spec; the operator retries", pollWhileFailed}, true
	case obs.volumeProblem != "":
		return verdict{kvv1.PhaseFailed, ReasonVolumeExpansionUnsupported, obs.volumeProblem, pollWhileFailed}, true
	}
	return verdict{}, false
}

// ClaimBelongs: a member of this cluster was seen healthy on the claim; or the claim carries this
// cluster's UID (claims of StatefulSets from this release on do); or, unlabelled (made by an
// earlier release, or by hand), it was created after this cluster was.
func ClaimBelongs(kvc *kvv1.KVCluster, claim *corev1.PersistentVolumeClaim) bool {
	if slices.ContainsFunc(kvc.Status.Members, func(m kvv1.MemberStatus) bool { return m.VolumeUID == string(claim.UID) }) {
		return true
	}
	if uid, ok := claim.Labels[specs.ClusterUIDLabel]; ok {
		return uid == string(kvc.UID)
	}
	return !claim.CreationTimestamp.Before(&kvc.CreationTimestamp)
}
