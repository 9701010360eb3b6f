package plan

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// Only members whose etcd container runs are asked: a member that cannot answer would hold the
// reconcile (and the worker every other cluster shares) for the whole timeout.
func TestOnlyMembersThatRunAreAsked(t *testing.T) {
	kvc := &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kv"}, Spec: kvv1.KVClusterSpec{Partitions: 3}}
	url := func(ord int) string { return specs.MemberClientURL(kvc, "http", ord) }
	tests := []struct {
		name string
		pods map[int]Pod
		want []string
	}{
		{"no pod seen yet: every member", nil, []string{url(0), url(1), url(2)}},
		{"all run", map[int]Pod{0: {Running: true}, 1: {Running: true}, 2: {Running: true}}, []string{url(0), url(1), url(2)}},
		{"one restarting, one not created", map[int]Pod{0: {Running: true}, 1: {Running: false}}, []string{url(0)}},
		{"one being deleted, its etcd still running (it may lead)", map[int]Pod{0: {Running: true}, 1: {Running: true, Terminating: true}, 2: {Running: true}}, []string{url(0), url(1), url(2)}},
		{"one being deleted, its etcd exited", map[int]Pod{0: {Running: true}, 1: {Terminating: true}, 2: {Running: true}}, []string{url(0), url(2)}},
		{"a surplus member's pod runs", map[int]Pod{0: {Running: true}, 3: {Running: true}}, []string{url(0), url(3)}},
		{"none runs yet", map[int]Pod{0: {}, 1: {}, 2: {}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs := Observation{Pods: tt.pods}
			got := obs.AskableURLs(kvc)
			if !slices.Equal(got, tt.want) {
				t.Errorf("AskableURLs = %v, want %v", got, tt.want)
			}
			for ord := range 4 {
				if asked := obs.Askable(ord); asked != (slices.Contains(tt.want, url(ord)) || tt.pods == nil) {
					t.Errorf("Askable(%d) = %v, disagrees with AskableURLs %v", ord, asked, got)
				}
			}
		})
	}
}
