package plan

import (
	"fmt"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/types"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// maxCatchUpLag is how many raft entries a restarted member may still be behind the leader to
// count as caught up. The leader's and the member's indexes are read a few milliseconds apart, so
// a member of a cluster under write load is never exactly level.
const maxCatchUpLag = 1000

// Action is the one change the operator makes to a running cluster in a reconcile.
type Action int

const (
	ActWait Action = iota
	ActPreUpgradeBackup
	ActRestartPod
	ActMoveLeader
	ActAddLearner
	ActPromote
	ActRemove
	ActWipeLearner
	ActUpdatePeerURL
)

// failedLearnerStarts is how many times a learner's etcd must have failed before its volume is
// reset. A volume holding a removed member's identity fails every start; a first failure alone
// says little: on the local cluster the pod of a learner added 3 s earlier had failed once, and
// resetting its volume (its claim is deleted and made again) kept the member out for minutes.
const failedLearnerStarts = 2

// Rollout is the plan for a running cluster: whether it still differs from the spec (pending),
// and the next single step. Every step is decided from what etcd and Kubernetes report now, so an
// operator restarted half-way resumes where the cluster is, not where it thinks it was.
type Rollout struct {
	Pending bool
	Action  Action
	Ordinal int
	// MemberID is the etcd member the action is about; To is the new leader of a MoveLeader.
	MemberID, To uint64
	// Endpoint is the client URL of the member at Ordinal; PeerURL its peer URL (ActAddLearner,
	// ActUpdatePeerURL).
	Endpoint, PeerURL string
	// PodUID is the UID of the pod the decision was made on: a deletion carries it as a
	// precondition, so a decision taken on a stale cache never deletes a pod already replaced.
	PodUID types.UID
	// VolumeUID is the data claim reset with the action, likewise a precondition: a learner's
	// (ActWipeLearner), or the new claim of a member removed for having lost its data (ActRemove).
	VolumeUID types.UID
	// OldJob is an earlier upgrade's pre-upgrade backup Job, deleted to make room for this one's;
	// Job is this upgrade's, to start once it is gone.
	OldJob  *batchv1.Job
	Job     *batchv1ac.JobApplyConfiguration
	Reason  string
	Message string
	// AwaitsEvent: the wait ends with a change the operator watches (a member pod made, gone,
	// started or Ready; the StatefulSet controller seeing the template), which wakes the cluster at once, so
	// it is polled meanwhile only to keep its progress deadline (rolloutPoll), not every 5 s.
	AwaitsEvent bool
}

// lostData: the member's pod runs, not on the volume the member was last seen healthy on, but on
// another: the member's data is lost, and etcd there took its identity and can never answer.
func lostData(kvc *kvv1.KVCluster, m members.Member, pod Pod, hasPod bool) bool {
	if m.Healthy || !m.Started() || !hasPod || pod.Terminating || pod.VolumeUID == "" {
		return false
	}
	recorded := recordedVolume(kvc, m)
	return recorded != "" && recorded != pod.VolumeUID
}

func wait(reason, format string, args ...any) Rollout {
	return Rollout{Pending: true, Action: ActWait, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// waitForEvent is a wait that a change the operator watches ends (Rollout.AwaitsEvent).
func waitForEvent(reason, format string, args ...any) Rollout {
	ro := wait(reason, format, args...)
	ro.AwaitsEvent = true
	return ro
}

// waitForPodOr is waitForEvent while the member pod at ordinal has yet to come, go or turn Ready
// (its change wakes the cluster), and otherwise wait: then only etcd, which is polled, shows
// what is awaited.
func waitForPodOr(obs Observation, ordinal int, reason, format string, args ...any) Rollout {
	if obs.podAwaited(ordinal) {
		return waitForEvent(reason, format, args...)
	}
	return wait(reason, format, args...)
}

// planRollout decides the next step for a formed cluster, in this order: finish a joining
// learner; take out a member that lost its data; add missing members; remove surplus members;
// restart outdated members (unhealthy ones first, then followers, the leader last after handing
// over leadership). Every step keeps a quorum: it never takes down a healthy voting member unless
// all the others are healthy.
func planRollout(kvc *kvv1.KVCluster, obs Observation) Rollout {
	if !bootstrapped(kvc, obs) {
		return Rollout{}
	}
	c := obs.Cluster
	if c == nil || !c.HasLeader {
		// Nothing can be changed safely without a quorum; whether work is pending is unknown.
		return Rollout{Pending: obs.outdatedPods() > 0, Action: ActWait, Reason: ReasonMembershipUnknown,
			Message: "etcd has no quorum or cannot be reached; membership changes wait for it"}
	}
	byOrdinal := map[int]members.Member{}
	voting, healthyVoting := 0, 0
	var learner *members.Member
	for _, m := range c.Members {
		ord, ok := MemberOrdinal(kvc, m)
		if _, taken := byOrdinal[ord]; taken { // two members claim one pod: at most one is ours
			ok = false
		}
		if !ok {
			// Taking it for one of ours could remove the wrong member or reset a voter's volume.
			return Rollout{Pending: true, Action: ActWait, Reason: ReasonUnknownMember, Message: fmt.Sprintf(
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

	// 0. A member restarted with another peer scheme than etcd's membership has for it.
	if ro, ok := planPeerURLs(kvc, obs, byOrdinal, ordinals); ok {
		return ro
	}

	// 1. A learner is joining: let it start, promote it once etcd says it is in sync.
	if learner != nil {
		ord, _ := MemberOrdinal(kvc, *learner) // every member maps to an ordinal (checked above)
		name := specs.MemberName(kvc, ord)
		pod, hasPod := obs.Pods[ord]
		switch {
		case ord >= partitions && allHealthy:
			return Rollout{Pending: true, Action: ActRemove, Ordinal: ord, MemberID: learner.ID, Reason: ReasonScaling,
				Message: fmt.Sprintf("removing learner %s: partitions was lowered to %d while it joined", name, partitions)}
		case !learner.Started() && hasPod && !pod.Ready && !pod.Terminating && !pod.Running && pod.Restarts >= failedLearnerStarts:
			// Its volume holds a previous member's data: it can only join empty. The learner
			// holds nothing the cluster needs.
			return Rollout{Pending: true, Action: ActWipeLearner, Ordinal: ord, MemberID: learner.ID, PodUID: pod.UID, VolumeUID: pod.VolumeUID, Reason: ReasonScaling,
				Message: fmt.Sprintf("member %s cannot start as a learner (%d restarts); deleting its pod and volume so it joins empty", name, pod.Restarts)}
		case lostData(kvc, *learner, pod, hasPod):
			// It joined on a volume that has gone since (one being reset as it started, say).
			return Rollout{Pending: true, Action: ActRemove, Ordinal: ord, MemberID: learner.ID, PodUID: pod.UID, VolumeUID: pod.VolumeUID, Reason: ReasonReplacingMember,
				Message: fmt.Sprintf("learner %s came back on a new, empty volume (its data is lost); resetting that volume and removing it from etcd to add it back", name)}
		case hasPod && pod.Terminating:
			// Promoted now, a member whose volume goes with its pod would come back without its data.
			return waitForEvent(ReasonScaling, "member %s is joining as a learner; waiting for its pod, being stopped, to come back before promoting it", name)
		case learner.Healthy && learner.Started():
			return Rollout{Pending: true, Action: ActPromote, Ordinal: ord, MemberID: learner.ID, Reason: ReasonScaling,
				Message: fmt.Sprintf("promoting learner %s to a voting member once it is in sync", name)}
		case !hasPod && obs.missingReferences() != "":
			return wait(ReasonPodsNotCreatable, "member %s is joining as a learner, but its pod cannot be created: %s", name, obs.missingReferences())
		case !hasPod || !pod.Running: // its etcd starting is a pod change
			return waitForEvent(ReasonScaling, "member %s is joining as a learner", name)
		default:
			return wait(ReasonScaling, "member %s is joining as a learner", name)
		}
	}

	// 2. A member came back on a new, empty volume: its data is lost, and etcd would crash on it.
	for _, ord := range ordinals {
		m := byOrdinal[ord]
		pod, ok := obs.Pods[ord]
		if !lostData(kvc, m, pod, ok) {
			continue
		}
		if healthyVoting < int(specs.Quorum(int32(voting-1))) {
			return wait(ReasonReplacingMember, "member %s lost its data, but removing it would leave no quorum", m.Name)
		}
		// Its pod came up on the new volume while the member was still in etcd's list, so etcd
		// there took the member's identity and wrote it down: it could never join as the new
		// learner, and a copy that keeps running never says so. The new volume holds nothing
		// else and is reset just before the removal, so the pod that joins starts empty. (The member's
		// own data was on the recorded volume: recordedVolume is that of this member ID.)
		return Rollout{Pending: true, Action: ActRemove, Ordinal: ord, MemberID: m.ID, PodUID: pod.UID, VolumeUID: pod.VolumeUID, Reason: ReasonReplacingMember,
			Message: fmt.Sprintf("member %s came back on a new, empty volume (its data is lost); resetting that volume and removing the member from etcd to add it back as a learner", m.Name)}
	}

	// 3. Add missing members, lowest ordinal first: a replaced member's slot, or a scale-up.
	for ord := range partitions {
		if _, ok := byOrdinal[ord]; ok {
			continue
		}
		reason := ReasonScaling
		pod, hasPod := obs.Pods[ord]
		if hasPod { // a scale-up's pod is only created after its member is added
			reason = ReasonReplacingMember
		}
		if why := obs.missingReferences(); !hasPod && why != "" { // it would never start
			return wait(ReasonPodsNotCreatable, "member %s is missing, and its pod could not be created: %s", specs.MemberName(kvc, ord), why)
		}
		if hasPod && pod.Terminating {
			// etcd in a pod being stopped may still join as the learner, on the volume going
			// with the pod (one just reset, say): wait for the pod the StatefulSet makes next.
			return waitForEvent(reason, "member %s is missing; waiting for its old pod to stop before adding it (a pod whose node is gone stops only when deleted with --force)", specs.MemberName(kvc, ord))
		}
		if !allHealthy {
			return wait(reason, "member %s is missing; waiting for every voting member to be healthy before adding it", specs.MemberName(kvc, ord))
		}
		// At the peer URL the pod, made from the template of the moment, listens at.
		return Rollout{Pending: true, Action: ActAddLearner, Ordinal: ord, PeerURL: templateTransport(kvc, obs).MemberPeerURL(kvc, ord), Reason: reason,
			Message: fmt.Sprintf("adding member %s as a learner (%d voting members, %d wanted)", specs.MemberName(kvc, ord), voting, partitions)}
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
				return Rollout{Pending: true, Action: ActMoveLeader, Ordinal: ord, MemberID: m.ID, To: to.ID, Reason: ReasonScaling,
					Message: fmt.Sprintf("moving leadership from %s to %s before removing it", name, to.Name)}
			}
		}
		return Rollout{Pending: true, Action: ActRemove, Ordinal: ord, MemberID: m.ID, Reason: ReasonScaling,
			Message: fmt.Sprintf("removing member %s (%d voting members, %d wanted)", name, voting, partitions)}
	}

	// 5. Restart members whose pod is outdated, one at a time.
	return planRestarts(kvc, obs, byOrdinal, ordinals, leader, voting, healthyVoting)
}

// planRestarts rolls outdated member pods: a version upgrade, or any other template change.
func planRestarts(kvc *kvv1.KVCluster, obs Observation, byOrdinal map[int]members.Member, ascending []int,
	leader members.Member, voting, healthyVoting int) Rollout {
	outdated := obs.outdatedPods()
	// A rollout under way ends only when every member answers on the target; outside one, a
	// member that is down is not the rollout's business: Ready reports it.
	lagging, anyLagging := firstNotOnTarget(kvc, obs, ascending, byOrdinal)
	settling := kvc.Status.Phase == kvv1.PhaseUpgrading && anyLagging
	if outdated == 0 && obs.STSSettled && healthyOnOtherVersion(kvc, obs.Cluster) == 0 && !settling {
		return Rollout{}
	}
	progress := rolloutProgress(kvc, obs.Cluster) + transportProgress(obs, templateTransport(kvc, obs))
	if !obs.STSSettled {
		return waitForEvent(ReasonUpgrading, "%s; waiting for the StatefulSet controller to see the new template", progress)
	}
	if outdated == 0 {
		if anyLagging {
			return waitForPodOr(obs, lagging, ReasonUpgrading, "%s; waiting for member %s to be healthy on %s", progress, specs.MemberName(kvc, lagging), kvc.Spec.Version)
		}
		return wait(ReasonUpgrading, "%s; waiting for the restarted members to report the new version", progress)
	}
	if kvc.Spec.Backup != nil && kvc.Status.CurrentVersion != kvc.Spec.Version {
		switch obs.preUpgradeBackup(kvc) {
		case jobMissing:
			// Two backups never run at once: a scheduled or requested one running goes first.
			if i := slices.IndexFunc(obs.Jobs, func(j Job) bool { return !j.Done }); i >= 0 {
				return wait(ReasonPreUpgradeBackup, "waiting for backup %s to finish before the pre-upgrade backup", obs.Jobs[i].Job.Name)
			}
			return Rollout{Pending: true, Action: ActPreUpgradeBackup, OldJob: obs.PreUpgradeJob, Reason: ReasonPreUpgradeBackup,
				Message: fmt.Sprintf("taking a backup before upgrading from %s to %s", kvc.Status.CurrentVersion, kvc.Spec.Version)}
		case jobRunning:
			return wait(ReasonPreUpgradeBackup, "waiting for the pre-upgrade backup %s", specs.PreUpgradeBackupJobName(kvc))
		case jobFailed:
			return wait(ReasonPreUpgradeBackup, "the pre-upgrade backup %s failed, so no member is upgraded: fix the backup "+
				"destination and delete the Job to retry, or set spec.version back to %s", specs.PreUpgradeBackupJobName(kvc), kvc.Status.CurrentVersion)
		}
	}
	// A member restarted now would not come back: the StatefulSet controller could not create its pod.
	if missing := obs.MissingPodReferences; len(missing) > 0 {
		return wait(ReasonPodsNotCreatable, "%s; no member is restarted, as its new pod could not be created: %s", progress, obs.missingReferences())
	}
	ordinals := slices.Clone(ascending)
	slices.Reverse(ordinals) // highest ordinal first, like a StatefulSet rolling update

	// A member pod that is gone or going: the StatefulSet brings it back; nothing else moves meanwhile.
	for _, ord := range ordinals {
		if pod, ok := obs.Pods[ord]; !ok || pod.Terminating {
			return waitForEvent(ReasonUpgrading, "%s; waiting for member %s to come back", progress, specs.MemberName(kvc, ord))
		}
	}
	// Unhealthy members first: restarting one that is down costs no availability.
	for _, ord := range ordinals {
		m, pod := byOrdinal[ord], obs.Pods[ord]
		if (!m.Healthy || !pod.Ready) && pod.Outdated {
			return Rollout{Pending: true, Action: ActRestartPod, Ordinal: ord, MemberID: m.ID, PodUID: pod.UID, Reason: ReasonUpgrading,
				Message: fmt.Sprintf("%s; restarting unhealthy member %s on the new template first", progress, m.Name)}
		}
	}
	for _, ord := range ordinals {
		m, pod := byOrdinal[ord], obs.Pods[ord]
		if !m.Healthy || !pod.Ready {
			return waitForPodOr(obs, ord, ReasonUpgrading, "%s; waiting for member %s to be healthy", progress, specs.MemberName(kvc, ord))
		}
		if !pod.Outdated && !caughtUp(m, leader) {
			return wait(ReasonUpgrading, "%s; waiting for member %s to catch up with the leader (applied index %d of %d)",
				progress, m.Name, m.AppliedIndex, leader.RaftIndex)
		}
	}
	if voting > 1 && healthyVoting-1 < int(specs.Quorum(int32(voting))) {
		return wait(ReasonUpgrading, "%s; restarting a member now would lose the quorum", progress)
	}
	// Followers first.
	for _, ord := range ordinals {
		m, pod := byOrdinal[ord], obs.Pods[ord]
		if pod.Outdated && !m.Leader {
			return Rollout{Pending: true, Action: ActRestartPod, Ordinal: ord, MemberID: m.ID, PodUID: pod.UID, Reason: ReasonUpgrading,
				Message: fmt.Sprintf("%s; restarting follower %s", progress, m.Name)}
		}
	}
	// The leader last, after handing leadership to an up-to-date member.
	ord, ok := MemberOrdinal(kvc, leader)
	if !ok {
		return wait(ReasonUpgrading, "%s; etcd reports no leader among this cluster's members", progress)
	}
	if to, ok := transferee(obs.Cluster, kvc, ord, obs); ok {
		return Rollout{Pending: true, Action: ActMoveLeader, Ordinal: ord, MemberID: leader.ID, To: to.ID, Reason: ReasonUpgrading,
			Message: fmt.Sprintf("%s; moving leadership from %s to %s before restarting it", progress, leader.Name, to.Name)}
	}
	return Rollout{Pending: true, Action: ActRestartPod, Ordinal: ord, MemberID: leader.ID, PodUID: obs.Pods[ord].UID, Reason: ReasonUpgrading,
		Message: fmt.Sprintf("%s; restarting %s, the only member (a single-member cluster is briefly unavailable)", progress, leader.Name)}
}

// firstNotOnTarget is the lowest ordinal whose member is not healthy and ready on spec.version.
func firstNotOnTarget(kvc *kvv1.KVCluster, obs Observation, ascending []int, byOrdinal map[int]members.Member) (int, bool) {
	for _, ord := range ascending {
		m, pod := byOrdinal[ord], obs.Pods[ord]
		if !m.Healthy || m.Version != kvc.Spec.Version || !pod.Ready {
			return ord, true
		}
	}
	return 0, false
}

// transferee is the voting member best placed to lead instead of the one at ordinal from: healthy,
// on the current template, the furthest applied.
func transferee(c *members.Cluster, kvc *kvv1.KVCluster, from int, obs Observation) (members.Member, bool) {
	var best members.Member
	found := false
	for _, m := range c.Members {
		ord, ok := MemberOrdinal(kvc, m)
		if !ok || ord == from || m.Learner || !m.Healthy || obs.Pods[ord].Outdated {
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
