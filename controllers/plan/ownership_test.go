package plan

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

func TestClaimBelongs(t *testing.T) {
	created := metav1.NewTime(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC))
	kvc := &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: "kv", UID: "uid-new", CreationTimestamp: created},
		Status: kvv1.KVClusterStatus{Members: []kvv1.MemberStatus{{Name: "kv-0", VolumeUID: "claim-seen-healthy"}}}}
	claim := func(uid types.UID, labelUID string, age time.Duration) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{UID: uid, CreationTimestamp: metav1.NewTime(created.Add(-age))}}
		if labelUID != "" {
			c.Labels = map[string]string{specs.ClusterUIDLabel: labelUID}
		}
		return c
	}
	tests := []struct {
		name  string
		claim *corev1.PersistentVolumeClaim
		want  bool
	}{
		{name: "labelled for this cluster", claim: claim("c1", "uid-new", -time.Minute), want: true},
		{name: "labelled for an earlier cluster of the same name", claim: claim("c2", "uid-old", time.Hour), want: false},
		{name: "labelled for an earlier cluster, although newer", claim: claim("c3", "uid-old", -time.Minute), want: false},
		{name: "a member was seen healthy on it (adopted)", claim: claim("claim-seen-healthy", "uid-old", time.Hour), want: true},
		{name: "unlabelled, made after the cluster (an earlier release's StatefulSet)", claim: claim("c4", "", -time.Minute), want: true},
		{name: "unlabelled, made in the same second", claim: claim("c5", "", 0), want: true},
		{name: "unlabelled, made before the cluster", claim: claim("c6", "", time.Second), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClaimBelongs(kvc, tt.claim); got != tt.want {
				t.Errorf("ClaimBelongs = %t, want %t", got, tt.want)
			}
		})
	}
}
