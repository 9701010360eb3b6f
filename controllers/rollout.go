package controllers

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// Reasons of the Reconciling condition while a running cluster is being changed.
const (
	ReasonUpgrading         = "Upgrading"
	ReasonScaling           = "Scaling"
	ReasonReplacingMember   = "ReplacingMember"
	ReasonPreUpgradeBackup  = "PreUpgradeBackup"
	ReasonRolloutStalled    = "RolloutStalled"
	ReasonMembershipUnknown = "MembershipUnknown"
	ReasonUnknownMember     = "UnknownMember"
)

// maxCatchUpLag is how many raft entries a restarted member may still be behind the leader to
// count as caught up. The leader's and the member's indexes are read a few milliseconds apart, so
// a member of a cluster under write load is never exactly level.
const maxCatchUpLag = 1000

// podInfo is what Kubernetes says about one member's pod.
type podInfo struct {
	uid         types.UID
	ready       bool
	terminating bool
	// outdated: the pod does not run the StatefulSet's current template (version, resources, …).
	outdated bool
	// restarts of the etcd container.
	restarts int32
	// volumeUID is the UID of the pod's data claim; empty while it has none.
	volumeUID types.UID
}

// jobState is the state of one Job the rollout waits for.
type jobState int

const (
	jobMissing jobState = iota
	jobRunning
	jobSucceeded
	jobFailed
)

// actionKind is the one change the operator makes to a running cluster in a reconcile.
type actionKind int

const (
	actWait actionKind = iota
	actPreUpgradeBackup
	actRestartPod
	actMoveLeader
	actAddLearner
	actPromote
	actRemove
	actWipeLearner
)

// rollout is the plan for a running cluster: whether it still differs from the spec (pending),
// and the next single step. Every step is decided from what etcd and Kubernetes report now, so an
// operator restarted half-way resumes where the cluster is, not where it thinks it was.
type rollout struct {
	pending bool
	action  actionKind
	ordinal int
	// memberID is the etcd member the action is about; to is the new leader of a MoveLeader.
	memberID, to uint64
	podUID       types.UID
	reason       string
	message      string
}

func wait(reason, format string, args ...any) rollout {
	return rollout{pending: true, action: actWait, reason: reason, message: fmt.Sprintf(format, args...)}
}

// memberOrdinal is the StatefulSet ordinal of an etcd member: by name once it started, by peer URL
// before (an added member is nameless until it runs).
func memberOrdinal(kvc *kvv1.KVCluster, m members.Member) (int, bool) {
	if ord, ok := specs.OrdinalOfMember(kvc, m.Name); ok {
		// Named like one of ours but at another address: someone else's member.
		if len(m.PeerURLs) > 0 && !slices.Contains(m.PeerURLs, specs.MemberPeerURL(kvc, ord)) {
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
func bootstrapped(kvc *kvv1.KVCluster, obs observation) bool {
	if kvc.Status.CurrentVersion != "" || (obs.membership != nil && obs.membership.State == specs.ClusterStateExisting) {
		return true
	}
	c := obs.cluster
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
func desiredMembership(kvc *kvv1.KVCluster, obs observation) (specs.Membership, int32) {
	if !bootstrapped(kvc, obs) {
		return specs.NewClusterMembership(kvc), kvc.Spec.Partitions
	}
	if obs.cluster == nil {
		if obs.membership != nil && obs.stsReplicas != nil {
			return *obs.membership, *obs.stsReplicas
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
	for _, mem := range obs.cluster.Members {
		if ord, ok := memberOrdinal(kvc, mem); ok {
			ordinals = append(ordinals, ord)
		}
	}
	return existingMembership(ordinals)
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
func disruptionBase(kvc *kvv1.KVCluster, obs observation) int32 {
	voting := 0
	if obs.cluster != nil {
		voting = obs.cluster.Voting()
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

// planRollout decides the next step for a formed cluster, in this order: finish a joining
// learner; take out a member that lost its data; add missing members; remove surplus members;
// restart outdated members (unhealthy ones first, then followers, the leader last after handing
// over leadership). Every step keeps a quorum: it never takes down a healthy voting member unless
// all the others are healthy.
func planRollout(kvc *kvv1.KVCluster, obs observation) rollout {
	if !bootstrapped(kvc, obs) {
		return rollout{}
	}
	c := obs.cluster
	if c == nil || !c.HasLeader {
		// Nothing can be changed safely without a quorum; whether work is pending is unknown.
		return rollout{pending: obs.outdatedPods() > 0, action: actWait, reason: ReasonMembershipUnknown,
			message: "etcd has no quorum or cannot be reached; membership changes wait for it"}
	}
	byOrdinal := map[int]members.Member{}
	voting, healthyVoting := 0, 0
	var learner *members.Member
	for _, m := range c.Members {
		ord, ok := memberOrdinal(kvc, m)
		if _, taken := byOrdinal[ord]; taken { // two members claim one pod: at most one is ours
			ok = false
		}
		if !ok {
			// Taking it for one of ours could remove the wrong member or reset a voter's volume.
			return rollout{pending: true, action: actWait, reason: ReasonUnknownMember, message: fmt.Sprintf(
				"etcd has a member that is none of this cluster's pods (ID %x, name %q, peer URLs %s); the operator changes nothing "+
					"while it is there. If it does not belong, remove it: etcdctl member remove %x", m.ID, m.Name, strings.Join(m.PeerURLs, ","), m.ID)}
		}
		byOrdinal[ord] = m
		if m.Learner {
			learner = &m
			continue
		}
		voting++
		if m.Healthy {
			healthyVoting++
		}
	}
	ordinals := make([]int, 0, len(byOrdinal))
	for ord := range byOrdinal {
		ordinals = append(ordinals, ord)
	}
	slices.Sort(ordinals)
	allHealthy := healthyVoting == voting
	partitions := int(kvc.Spec.Partitions)
	leader, _ := c.Leader()

	// 1. A learner is joining: let it start, promote it once etcd says it is in sync.
	if learner != nil {
		ord, _ := memberOrdinal(kvc, *learner) // every member maps to an ordinal (checked above)
		name := specs.MemberName(kvc, ord)
		pod, hasPod := obs.pods[ord]
		switch {
		case ord >= partitions && allHealthy:
			return rollout{pending: true, action: actRemove, ordinal: ord, memberID: learner.ID, reason: ReasonScaling,
				message: fmt.Sprintf("removing learner %s: partitions was lowered to %d while it joined", name, partitions)}
		case !learner.Started() && hasPod && !pod.ready && !pod.terminating && pod.restarts > 0:
			// Its volume holds a previous member's data (or a failed first start): it can only
			// join empty. The learner holds nothing the cluster needs.
			return rollout{pending: true, action: actWipeLearner, ordinal: ord, memberID: learner.ID, podUID: pod.uid, reason: ReasonScaling,
				message: fmt.Sprintf("member %s cannot start as a learner (%d restarts); deleting its pod and volume so it joins empty", name, pod.restarts)}
		case learner.Healthy && learner.Started():
			return rollout{pending: true, action: actPromote, ordinal: ord, memberID: learner.ID, reason: ReasonScaling,
				message: fmt.Sprintf("promoting learner %s to a voting member once it is in sync", name)}
		default:
			return wait(ReasonScaling, "member %s is joining as a learner", name)
		}
	}

	// 2. A member came back on a new, empty volume: its data is lost, and etcd would crash on it.
	for _, ord := range ordinals {
		m := byOrdinal[ord]
		pod, ok := obs.pods[ord]
		if m.Healthy || !m.Started() || !ok || pod.terminating || pod.volumeUID == "" {
			continue
		}
		recorded := recordedVolume(kvc, m.Name)
		if recorded == "" || recorded == pod.volumeUID {
			continue
		}
		if healthyVoting < int(specs.Quorum(int32(voting-1))) {
			return wait(ReasonReplacingMember, "member %s lost its data, but removing it would leave no quorum", m.Name)
		}
		return rollout{pending: true, action: actRemove, ordinal: ord, memberID: m.ID, reason: ReasonReplacingMember,
			message: fmt.Sprintf("member %s came back on a new, empty volume (its data is lost); removing it from etcd to add it back as a learner", m.Name)}
	}

	// 3. Add missing members, lowest ordinal first: a replaced member's slot, or a scale-up.
	for ord := range partitions {
		if _, ok := byOrdinal[ord]; ok {
			continue
		}
		reason := ReasonScaling
		if _, ok := obs.pods[ord]; ok { // a scale-up's pod is only created after its member is added
			reason = ReasonReplacingMember
		}
		if !allHealthy {
			return wait(reason, "member %s is missing; waiting for every voting member to be healthy before adding it", specs.MemberName(kvc, ord))
		}
		return rollout{pending: true, action: actAddLearner, ordinal: ord, reason: reason,
			message: fmt.Sprintf("adding member %s as a learner (%d voting members, %d wanted)", specs.MemberName(kvc, ord), voting, partitions)}
	}

	// 4. Remove surplus members, highest ordinal first, each leaving etcd before its pod goes.
	for _, ord := range slices.Backward(ordinals) {
		if ord < partitions {
			break
		}
		m := byOrdinal[ord]
		name := specs.MemberName(kvc, ord)
		if !allHealthy {
			return wait(ReasonScaling, "waiting for every member to be healthy before removing %s", name)
		}
		if m.Leader {
			if to, ok := transferee(c, kvc, ord, obs); ok {
				return rollout{pending: true, action: actMoveLeader, ordinal: ord, memberID: m.ID, to: to.ID, reason: ReasonScaling,
					message: fmt.Sprintf("moving leadership from %s to %s before removing it", name, to.Name)}
			}
		}
		return rollout{pending: true, action: actRemove, ordinal: ord, memberID: m.ID, reason: ReasonScaling,
			message: fmt.Sprintf("removing member %s (%d voting members, %d wanted)", name, voting, partitions)}
	}

	// 5. Restart members whose pod is outdated, one at a time.
	return planRestarts(kvc, obs, byOrdinal, ordinals, leader, voting, healthyVoting)
}

// planRestarts rolls outdated member pods: a version upgrade, or any other template change.
func planRestarts(kvc *kvv1.KVCluster, obs observation, byOrdinal map[int]members.Member, ascending []int,
	leader members.Member, voting, healthyVoting int) rollout {
	outdated := obs.outdatedPods()
	// A rollout under way ends only when every member answers on the target; outside one, a
	// member that is down is not the rollout's business: Ready reports it.
	lagging, anyLagging := firstNotOnTarget(kvc, obs, ascending, byOrdinal)
	settling := kvc.Status.Phase == kvv1.PhaseUpgrading && anyLagging
	if outdated == 0 && obs.stsSettled && healthyOnOtherVersion(kvc, obs.cluster) == 0 && !settling {
		return rollout{}
	}
	progress := rolloutProgress(kvc, obs.cluster)
	if !obs.stsSettled {
		return wait(ReasonUpgrading, "%s; waiting for the StatefulSet controller to see the new template", progress)
	}
	if outdated == 0 {
		if anyLagging {
			return wait(ReasonUpgrading, "%s; waiting for member %s to be healthy on %s", progress, specs.MemberName(kvc, lagging), kvc.Spec.Version)
		}
		return wait(ReasonUpgrading, "%s; waiting for the restarted members to report the new version", progress)
	}
	if kvc.Spec.Backup != nil && kvc.Status.CurrentVersion != kvc.Spec.Version {
		switch obs.preUpgradeBackup {
		case jobMissing:
			return rollout{pending: true, action: actPreUpgradeBackup, reason: ReasonPreUpgradeBackup,
				message: fmt.Sprintf("taking a backup before upgrading from %s to %s", kvc.Status.CurrentVersion, kvc.Spec.Version)}
		case jobRunning:
			return wait(ReasonPreUpgradeBackup, "waiting for the pre-upgrade backup %s", specs.PreUpgradeBackupJobName(kvc))
		case jobFailed:
			return wait(ReasonPreUpgradeBackup, "the pre-upgrade backup %s failed, so no member is upgraded: fix the backup "+
				"destination and delete the Job to retry, or set spec.version back to %s", specs.PreUpgradeBackupJobName(kvc), kvc.Status.CurrentVersion)
		}
	}
	ordinals := slices.Clone(ascending)
	slices.Reverse(ordinals) // highest ordinal first, like a StatefulSet rolling update

	// A member pod that is gone or going: the StatefulSet brings it back; nothing else moves meanwhile.
	for _, ord := range ordinals {
		if pod, ok := obs.pods[ord]; !ok || pod.terminating {
			return wait(ReasonUpgrading, "%s; waiting for member %s to come back", progress, specs.MemberName(kvc, ord))
		}
	}
	// Unhealthy members first: restarting one that is down costs no availability.
	for _, ord := range ordinals {
		m, pod := byOrdinal[ord], obs.pods[ord]
		if (!m.Healthy || !pod.ready) && pod.outdated {
			return rollout{pending: true, action: actRestartPod, ordinal: ord, memberID: m.ID, podUID: pod.uid, reason: ReasonUpgrading,
				message: fmt.Sprintf("%s; restarting unhealthy member %s on the new template first", progress, m.Name)}
		}
	}
	for _, ord := range ordinals {
		m, pod := byOrdinal[ord], obs.pods[ord]
		if !m.Healthy || !pod.ready {
			return wait(ReasonUpgrading, "%s; waiting for member %s to be healthy", progress, specs.MemberName(kvc, ord))
		}
		if !pod.outdated && !caughtUp(m, leader) {
			return wait(ReasonUpgrading, "%s; waiting for member %s to catch up with the leader (applied index %d of %d)",
				progress, m.Name, m.AppliedIndex, leader.RaftIndex)
		}
	}
	if voting > 1 && healthyVoting-1 < int(specs.Quorum(int32(voting))) {
		return wait(ReasonUpgrading, "%s; restarting a member now would lose the quorum", progress)
	}
	// Followers first.
	for _, ord := range ordinals {
		m, pod := byOrdinal[ord], obs.pods[ord]
		if pod.outdated && !m.Leader {
			return rollout{pending: true, action: actRestartPod, ordinal: ord, memberID: m.ID, podUID: pod.uid, reason: ReasonUpgrading,
				message: fmt.Sprintf("%s; restarting follower %s", progress, m.Name)}
		}
	}
	// The leader last, after handing leadership to an up-to-date member.
	ord, ok := memberOrdinal(kvc, leader)
	if !ok {
		return wait(ReasonUpgrading, "%s; etcd reports no leader among this cluster's members", progress)
	}
	if to, ok := transferee(obs.cluster, kvc, ord, obs); ok {
		return rollout{pending: true, action: actMoveLeader, ordinal: ord, memberID: leader.ID, to: to.ID, reason: ReasonUpgrading,
			message: fmt.Sprintf("%s; moving leadership from %s to %s before restarting it", progress, leader.Name, to.Name)}
	}
	return rollout{pending: true, action: actRestartPod, ordinal: ord, memberID: leader.ID, podUID: obs.pods[ord].uid, reason: ReasonUpgrading,
		message: fmt.Sprintf("%s; restarting %s, the only member (a single-member cluster is briefly unavailable)", progress, leader.Name)}
}

// firstNotOnTarget is the lowest ordinal whose member is not healthy and ready on spec.version.
func firstNotOnTarget(kvc *kvv1.KVCluster, obs observation, ascending []int, byOrdinal map[int]members.Member) (int, bool) {
	for _, ord := range ascending {
		m, pod := byOrdinal[ord], obs.pods[ord]
		if !m.Healthy || m.Version != kvc.Spec.Version || !pod.ready {
			return ord, true
		}
	}
	return 0, false
}

// transferee is the voting member best placed to lead instead of the one at ordinal from: healthy,
// on the current template, the furthest applied.
func transferee(c *members.Cluster, kvc *kvv1.KVCluster, from int, obs observation) (members.Member, bool) {
	var best members.Member
	found := false
	for _, m := range c.Members {
		ord, ok := memberOrdinal(kvc, m)
		if !ok || ord == from || m.Learner || !m.Healthy || obs.pods[ord].outdated {
			continue
		}
		if !found || m.AppliedIndex > best.AppliedIndex {
			best, found = m, true
		}
	}
	return best, found
}

func caughtUp(m, leader members.Member) bool {
	return m.AppliedIndex+maxCatchUpLag >= leader.RaftIndex
}

// versionProgress counts the members reporting the spec's version.
func versionProgress(kvc *kvv1.KVCluster, c *members.Cluster) (onTarget, total int) {
	if c == nil {
		return 0, 0
	}
	for _, m := range c.Members {
		if m.Version == kvc.Spec.Version {
			onTarget++
		}
	}
	return onTarget, len(c.Members)
}

// healthyOnOtherVersion counts the answering members that do not run the spec's version yet.
func healthyOnOtherVersion(kvc *kvv1.KVCluster, c *members.Cluster) int {
	n := 0
	for _, m := range c.Members {
		if m.Healthy && m.Version != kvc.Spec.Version {
			n++
		}
	}
	return n
}

func rolloutProgress(kvc *kvv1.KVCluster, c *members.Cluster) string {
	n, total := versionProgress(kvc, c)
	return fmt.Sprintf("%d/%d members on %s", n, total, kvc.Spec.Version)
}

// recordedVolume is the claim a member was last seen healthy on.
func recordedVolume(kvc *kvv1.KVCluster, name string) types.UID {
	for _, m := range kvc.Status.Members {
		if m.Name == name {
			return types.UID(m.VolumeUID)
		}
	}
	return ""
}
