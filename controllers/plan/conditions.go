package plan

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// SetCondition is the one way a condition is set: on the status about to be written, for the
// cluster's generation. lastTransitionTime becomes at only when the condition's status changes.
func SetCondition(st *kvv1.KVClusterStatus, kvc *kvv1.KVCluster, condType string, status bool, reason, message string, at time.Time) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: condType, Status: s, Reason: reason, Message: message,
		ObservedGeneration: kvc.Generation, LastTransitionTime: metav1.NewTime(at.Truncate(time.Second)),
	})
}
