package specs

import (
	"k8s.io/apimachinery/pkg/util/intstr"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	policyv1ac "k8s.io/client-go/applyconfigurations/policy/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// Quorum is the number of voting members etcd needs to accept writes.
func Quorum(partitions int32) int32 { return partitions/2 + 1 }

// PodDisruptionBudget lets voluntary disruptions (drains) take down only members that the cluster
// can lose without losing quorum: (n-1)/2 of n, where n is the voting members etcd has now — while
// scaling up from 3 to 5, a drain may still take only one. A single-member cluster allows none,
// because evicting its only member is an outage.
func PodDisruptionBudget(kvc *kvv1.KVCluster, voting int32) *policyv1ac.PodDisruptionBudgetApplyConfiguration {
	return policyv1ac.PodDisruptionBudget(kvc.Name, kvc.Namespace).
		WithLabels(Labels(kvc)).
		WithOwnerReferences(OwnerReference(kvc)).
		WithSpec(policyv1ac.PodDisruptionBudgetSpec().
			WithMaxUnavailable(intstr.FromInt32(voting - Quorum(voting))).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(SelectorLabels(kvc))))
}
