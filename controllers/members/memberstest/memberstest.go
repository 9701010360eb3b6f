// Package memberstest builds etcd's view of a KVCluster's members for tests: every test that
// fakes etcd starts from the same answer.
package memberstest

import (
	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// Healthy is etcd's answer for a formed cluster: n voting members named and addressed as the
// operator names its pods (ordinals 0..n-1, IDs 1..n), all on version, healthy and caught up
// (applied index 500), member 0 leading.
func Healthy(kvc *kvv1.KVCluster, n int, version string) members.Cluster {
	c := members.Cluster{HasLeader: true}
	for i := range n {
		c.Members = append(c.Members, members.Member{ID: uint64(i + 1), Name: specs.MemberName(kvc, i), Healthy: true, Leader: i == 0,
			Version: version, PeerURLs: []string{specs.MemberPeerURL(kvc, i)}, RaftIndex: 500, AppliedIndex: 500})
	}
	return c
}
