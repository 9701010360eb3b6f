package plan

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// MemberOrdinal is the StatefulSet ordinal of an etcd member: by name once it started, by peer URL
// before (an added member is nameless until it runs).
func MemberOrdinal(kvc *kvv1.KVCluster, m members.Member) (int, bool) {
	if ord, ok := specs.OrdinalOfMember(kvc, m.Name); ok {
		// Named like one of ours but at another address: someone else's member. Either scheme is
		// ours: a cluster moving to TLS has both.
		if len(m.PeerURLs) > 0 && !slices.ContainsFunc(m.PeerURLs, func(u string) bool {
			at, ok := specs.OrdinalOfPeerURL(kvc, u)
			return ok && at == ord
		}) {
			return 0, false
		}
		return ord, true
	}
	for _, u := range m.PeerURLs {
		if ord, ok := specs.OrdinalOfPeerURL(kvc, u); ok {
			return ord, true
		}
	}
	return 0, false
}

// bootstrapped reports whether the cluster has formed (now or before); until then members start as
// a new cluster, afterwards a member starting without data joins the existing one.
func bootstrapped(kvc *kvv1.KVCluster, obs Observation) bool {
	if kvc.Status.CurrentVersion != "" || (obs.Membership != nil && obs.Membership.State == specs.ClusterStateExisting) {
		return true
	}
	c := obs.Cluster
	if c == nil || !c.HasLeader || !c.AllHealthy() {
		return false
	}
	for _, m := range c.Members {
		if !m.Started() {
			return false
		}
	}
	return true
}

// desiredMembership is what members starting without data are told, and how many pods run. Once
// the cluster formed, both follow etcd's own member list; while etcd cannot be asked, the last
// written ones are kept.
func desiredMembership(kvc *kvv1.KVCluster, obs Observation) (specs.Membership, int32) {
	if !bootstrapped(kvc, obs) {
		return specs.NewClusterMembership(kvc), kvc.Spec.Partitions
	}
	if obs.Cluster == nil {
		if obs.Membership != nil && obs.STSReplicas != nil {
			return *obs.Membership, *obs.STSReplicas
		}
		var ordinals []int
		for _, ms := range kvc.Status.Members {
			if ord, ok := specs.OrdinalOfMember(kvc, ms.Name); ok {
				ordinals = append(ordinals, ord)
			}
		}
		if len(ordinals) == 0 {
			ordinals = specs.NewClusterMembership(kvc).Ordinals
		}
		return existingMembership(ordinals)
	}
	var ordinals []int
	urls := map[int]string{}
	for _, mem := range obs.Cluster.Members {
		if ord, ok := MemberOrdinal(kvc, mem); ok {
			ordinals = append(ordinals, ord)
			if len(mem.PeerURLs) == 1 && mem.PeerURLs[0] != specs.MemberPeerURL(kvc, ord) {
				urls[ord] = mem.PeerURLs[0] // a cluster moving to TLS: as etcd has it
			}
		}
	}
	m, replicas := existingMembership(ordinals)
	if len(urls) > 0 {
		m.PeerURLs = urls
	}
	return m, replicas
}

// existingMembership is the membership of a formed cluster with these members; its pods are the
// ordinals up to the highest member's (a removed member's slot may be a hole).
func existingMembership(ordinals []int) (specs.Membership, int32) {
	slices.Sort(ordinals)
	m := specs.Membership{State: specs.ClusterStateExisting, Ordinals: ordinals}
	if len(ordinals) == 0 {
		return m, 0
	}
	return m, int32(ordinals[len(ordinals)-1] + 1)
}

// disruptionBase is the member count the PodDisruptionBudget protects: the voting members etcd
// has (the last known count while it cannot be asked), never more than the spec's.
func disruptionBase(kvc *kvv1.KVCluster, obs Observation) int32 {
	voting := 0
	if obs.Cluster != nil {
		voting = obs.Cluster.Voting()
	} else {
		for _, m := range kvc.Status.Members {
			if !m.Learner {
				voting++
			}
		}
	}
	if voting == 0 {
		return kvc.Spec.Partitions
	}
	return min(int32(voting), kvc.Spec.Partitions)
}

// recordedVolume is the claim the member was last seen healthy on. A former member of the same
// name (removed and added back with a new ID) has none: its claim is not the new member's.
func recordedVolume(kvc *kvv1.KVCluster, m members.Member) types.UID {
	if prev := recordedMember(kvc, memberPodName(kvc, m)); prev != nil && prev.ID == fmt.Sprintf("%x", m.ID) {
		return types.UID(prev.VolumeUID)
	}
	return ""
}

// memberPodName is the member's pod name: the name it published, or, for an added member that
// has not run yet, the name of the pod at its peer URL ("" for none of the cluster's).
func memberPodName(kvc *kvv1.KVCluster, m members.Member) string {
	if m.Started() {
		return m.Name
	}
	if ord, ok := MemberOrdinal(kvc, m); ok {
		return specs.MemberName(kvc, ord)
	}
	return ""
}

// recordedMember is what the last status said of the member with this name.
func recordedMember(kvc *kvv1.KVCluster, name string) *kvv1.MemberStatus {
	for i := range kvc.Status.Members {
		if kvc.Status.Members[i].Name == name {
			return &kvc.Status.Members[i]
		}
	}
	return nil
}

// awaitedPodsEvery is how often at most the operator wakes the StatefulSet controller for the same
// awaited pods, and awaitedPodsFor for how long: a pod still missing after that is kept out by
// something else (a quota, an admission webhook), which the StatefulSet's events name.
const (
	awaitedPodsEvery = 30 * time.Second
	awaitedPodsFor   = 10 * time.Minute
)

// awaitedPods is the StatefulSet's specs.AwaitedPodsAnnotation: the ordinals below its replicas
// that have neither a pod nor a claim, not even one being deleted, once its controller has seen
// its spec (a member whose volume was reset or deleted: the controller may be backing off for
// minutes), when they were first awaited and when last named ("1@<first>@<last>", RFC 3339).
// The value changes, and so wakes the controller, when other pods are awaited, and every
// awaitedPodsEvery for awaitedPodsFor while the same ones are; otherwise it stays as it is.
func awaitedPods(obs Observation, now time.Time) string {
	if obs.STSReplicas == nil || !obs.STSSettled {
		return obs.STSAwaitedPods
	}
	var awaited []string
	for ord := range int(*obs.STSReplicas) {
		_, pod := obs.Pods[ord]
		_, claim := obs.Claims[ord]
		if !pod && !claim && !slices.Contains(obs.ClaimsBeingDeleted, ord) {
			awaited = append(awaited, strconv.Itoa(ord))
		}
	}
	if len(awaited) == 0 {
		return obs.STSAwaitedPods
	}
	ordinals, stamp := strings.Join(awaited, ","), now.UTC().Format(time.RFC3339)
	prev := strings.Split(obs.STSAwaitedPods, "@")
	if len(prev) != 3 || prev[0] != ordinals {
		return ordinals + "@" + stamp + "@" + stamp
	}
	first, err1 := time.Parse(time.RFC3339, prev[1])
	last, err2 := time.Parse(time.RFC3339, prev[2])
	if err1 != nil || err2 != nil {
		return ordinals + "@" + stamp + "@" + stamp
	}
	if now.Sub(first) >= awaitedPodsFor || now.Sub(last) < awaitedPodsEvery {
		return obs.STSAwaitedPods
	}
	return ordinals + "@" + prev[1] + "@" + stamp
}
