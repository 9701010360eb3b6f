package controllers

import (
	"fmt"
	"slices"

	batchv1 "k8s.io/api/batch/v1"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// Condition reasons.
const (
	ReasonCreating           = "Creating"
	ReasonClusterReady       = "ClusterReady"
	ReasonMembersUnavailable = "MembersUnavailable"
	ReasonProgressDeadline   = "ProgressDeadlineExceeded"
	ReasonQuorumLost         = "QuorumLost"
	ReasonSpecChanged        = "SpecChanged"
	ReasonNotFailed          = "NotFailed"
	ReasonIdle               = "Idle"
)

// How often a cluster is looked at again when nothing else triggers a reconcile: etcd's health
// is not a Kubernetes object, so it is polled.
const (
	pollWhileProgressing = 5 * time.Second
	pollWhileHealthy     = time.Minute
	pollWhileFailed      = 30 * time.Second
)

// observation is what one reconcile saw of a cluster.
type observation struct {
	// readyMembers is the StatefulSet's count of ready member pods.
	readyMembers int32
	// cluster is etcd's own view; nil when etcd could not be asked or did not answer with a quorum.
	cluster *members.Cluster
	// etcdErr says why cluster is nil.
	etcdErr error

	// pods are the member pods by ordinal.
	pods map[int]podInfo
	// stsReplicas is the StatefulSet's current replicas (nil before it exists); stsSettled is true
	// when its controller has seen its latest spec, so pod revisions can be compared with it.
	stsReplicas *int32
	stsSettled  bool
	// membership is what the membership ConfigMap says now (nil before it exists).
	membership *specs.Membership
	// preUpgradeJob is the pre-upgrade backup Job, of this or an earlier upgrade; preUpgradeBackup
	// is its state if it is this upgrade's.
	preUpgradeJob    *batchv1.Job
	preUpgradeBackup jobState
	// rollout is the plan for changing a running cluster.
	rollout rollout
	// foreignChildren and leftoverClaims are objects the cluster needs that belong to someone
	// else; while there are any, nothing is written but status.
	foreignChildren, leftoverClaims []string
	// applyRejected is why the API server refused to apply the cluster's objects.
	applyRejected string
	// stsForeign: the StatefulSet under the cluster's name is someone else's.
	stsForeign bool
	// stsClaimsUnlabelled: the StatefulSet was made by a release that did not label claims.
	stsClaimsUnlabelled bool
}

func (o observation) outdatedPods() int {
	n := 0
	for _, p := range o.pods {
		if p.outdated {
			n++
		}
	}
	return n
}

// healthy is the Ready criterion: every member pod ready, and etcd reporting a leader and exactly
// the expected voting members, all of them answering, and no alarm (under which etcd refuses writes).
func (o observation) healthy(kvc *kvv1.KVCluster) bool {
	n := int(kvc.Spec.Partitions)
	return o.readyMembers == kvc.Spec.Partitions && o.cluster != nil && o.cluster.HasLeader &&
		o.cluster.AllHealthy() && len(o.cluster.Members) == n && o.cluster.Voting() == n && len(o.cluster.Alarms) == 0
}

func (o observation) quorumLost() bool { return o.cluster == nil || !o.cluster.HasLeader }

// summary is a one-line account of the members for condition messages.
func (o observation) summary(kvc *kvv1.KVCluster) string {
	s := fmt.Sprintf("%d/%d members ready", o.readyMembers, kvc.Spec.Partitions)
	switch {
	case o.etcdErr != nil:
		s += "; etcd: " + o.etcdErr.Error()
	case o.cluster != nil && !o.cluster.HasLeader:
		s += "; etcd reports no leader"
	case o.cluster != nil && o.cluster.Voting() != int(kvc.Spec.Partitions):
		s += fmt.Sprintf("; etcd has %d voting members", o.cluster.Voting())
	}
	if o.cluster != nil {
		for _, a := range o.cluster.Alarms {
			s += fmt.Sprintf("; etcd raised the %s alarm for member %x", a.Type, a.MemberID)
		}
	}
	return s
}

// verdict is what a phase function decided.
type verdict struct {
	phase        kvv1.Phase
	reason       string
	message      string
	requeueAfter time.Duration
}

// phaseFunc decides the next phase from the current one. Each phase is one small function; the
// phase itself is persisted in status, so a restarted operator resumes where it was.
type phaseFunc func(kvc *kvv1.KVCluster, obs observation, now time.Time) verdict

var phaseFuncs = map[kvv1.Phase]phaseFunc{
	kvv1.PhaseCreating:  creating,
	kvv1.PhaseReady:     ready,
	kvv1.PhaseUpgrading: upgrading,
	kvv1.PhaseFailed:    failed,
}

// creating waits for every member and for etcd to agree on a healthy cluster of the right size.
func creating(kvc *kvv1.KVCluster, obs observation, now time.Time) verdict {
	if obs.healthy(kvc) {
		return ready(kvc, obs, now)
	}
	if deadlinePassed(kvc, now) {
		return verdict{kvv1.PhaseFailed, ReasonProgressDeadline, fmt.Sprintf(
			"the cluster did not become ready within %ds (%s). Check the member pods' events and logs "+
				"(kubectl describe pods -l app.kubernetes.io/instance=%s), fix the cause, then change the spec "+
				"or delete and re-create the KVCluster", kvc.Spec.ProgressDeadlineSeconds, obs.summary(kvc), kvc.Name),
			pollWhileFailed}
	}
	return verdict{kvv1.PhaseCreating, ReasonCreating, obs.summary(kvc), pollWhileProgressing}
}

// ready watches a formed cluster. Losing members is reported on the Ready condition while the
// StatefulSet brings pods back; only a quorum lost for longer than the deadline needs a person.
func ready(kvc *kvv1.KVCluster, obs observation, now time.Time) verdict {
	switch {
	case obs.rollout.reason == ReasonUnknownMember: // not a change the operator makes: a person's to remove
		return verdict{kvv1.PhaseReady, ReasonUnknownMember, obs.rollout.message, pollWhileProgressing}
	case obs.rollout.pending && obs.rollout.reason != ReasonMembershipUnknown:
		return verdict{kvv1.PhaseUpgrading, obs.rollout.reason, obs.rollout.message, pollWhileProgressing}
	}
	if obs.healthy(kvc) {
		return verdict{kvv1.PhaseReady, ReasonClusterReady, obs.summary(kvc) + "; etcd is healthy", pollWhileHealthy}
	}
	if obs.quorumLost() && deadlinePassed(kvc, now) {
		return verdict{kvv1.PhaseFailed, ReasonQuorumLost, fmt.Sprintf(
			"etcd has had no quorum for more than %ds (%s). If the lost members cannot come back, "+
				"create a new KVCluster restored from the latest backup", kvc.Spec.ProgressDeadlineSeconds, obs.summary(kvc)),
			pollWhileFailed}
	}
	return verdict{kvv1.PhaseReady, ReasonMembersUnavailable, obs.summary(kvc), pollWhileProgressing}
}

// upgrading changes a running cluster one step per reconcile (see planRollout) until it matches
// the spec. A rollout that makes no progress for longer than the deadline needs a person.
func upgrading(kvc *kvv1.KVCluster, obs observation, now time.Time) verdict {
	if !obs.rollout.pending {
		return ready(kvc, obs, now)
	}
	if deadlinePassed(kvc, now) {
		reason, what := ReasonRolloutStalled, "the rollout made no progress"
		if obs.quorumLost() {
			reason, what = ReasonQuorumLost, "etcd lost its quorum during the rollout and did not regain it"
		}
		undo := ""
		if kvc.Spec.Version != kvc.Status.CurrentVersion {
			undo = fmt.Sprintf(", e.g. set spec.version back to %s to undo the unfinished upgrade", orUnknown(kvc.Status.CurrentVersion))
		}
		return verdict{kvv1.PhaseFailed, reason, fmt.Sprintf(
			"%s for more than %ds: %s (%s). Fix the cause (kubectl describe pods -l app.kubernetes.io/instance=%s), "+
				"then change the spec to continue%s",
			what, kvc.Spec.ProgressDeadlineSeconds, obs.rollout.message, obs.summary(kvc), kvc.Name, undo),
			pollWhileFailed}
	}
	return verdict{kvv1.PhaseUpgrading, obs.rollout.reason, obs.rollout.message, pollWhileProgressing}
}

func orUnknown(s string) string {
	if s == "" {
		return "the previous version"
	}
	return s
}

// failed keeps the cluster Failed until a person changes the spec, or the cluster heals itself.
func failed(kvc *kvv1.KVCluster, obs observation, now time.Time) verdict {
	if c := meta.FindStatusCondition(kvc.Status.Conditions, kvv1.ConditionStalled); c != nil && blockingReasons[c.Reason] { // and it is resolved
		if bootstrapped(kvc, obs) {
			return ready(kvc, obs, now)
		}
		return verdict{kvv1.PhaseCreating, ReasonCreating, "resuming: " + obs.summary(kvc), pollWhileProgressing}
	}
	if kvc.Generation != kvc.Status.ObservedGeneration {
		phase := kvv1.PhaseCreating
		if bootstrapped(kvc, obs) {
			phase = kvv1.PhaseUpgrading
		}
		return verdict{phase, ReasonSpecChanged, "the spec changed; trying again: " + obs.summary(kvc), pollWhileProgressing}
	}
	if obs.healthy(kvc) && !obs.rollout.pending {
		return verdict{kvv1.PhaseReady, ReasonClusterReady, obs.summary(kvc) + "; etcd is healthy", pollWhileHealthy}
	}
	v := verdict{phase: kvv1.PhaseFailed, reason: ReasonProgressDeadline, message: obs.summary(kvc), requeueAfter: pollWhileFailed}
	if c := meta.FindStatusCondition(kvc.Status.Conditions, kvv1.ConditionStalled); c != nil && c.Status == metav1.ConditionTrue {
		v.reason, v.message = c.Reason, c.Message
	}
	return v
}

// deadlinePassed reports whether the phase has made no progress for longer than the deadline. The
// clock starts at the first status the operator writes, not at creation: an operator installed (or
// down) long after a cluster was created must not fail it on sight.
func deadlinePassed(kvc *kvv1.KVCluster, now time.Time) bool {
	if kvc.Status.LastProgressTime == nil {
		return false
	}
	deadline := time.Duration(kvc.Spec.ProgressDeadlineSeconds) * time.Second
	if deadline <= 0 {
		deadline = 600 * time.Second
	}
	return now.Sub(kvc.Status.LastProgressTime.Time) > deadline
}

// decide computes the next full status of a cluster from what was observed. It is pure: the same
// inputs always give the same status, and it leaves unchanged every field (and condition
// transition time) whose value did not change, so an idle reconcile has nothing to write.
func decide(kvc *kvv1.KVCluster, obs observation, endpoint string, now time.Time) (kvv1.KVClusterStatus, verdict) {
	fn, ok := phaseFuncs[kvc.Status.Phase]
	if !ok { // a new cluster, or a phase this release does not drive
		fn = creating
	}
	v, blocked := blockedVerdict(kvc, obs)
	if !blocked {
		v = fn(kvc, obs, now)
	}

	st := *kvc.Status.DeepCopy()
	st.ObservedGeneration = kvc.Generation
	st.ClientEndpoint = endpoint
	nowTime := metav1.NewTime(now.Truncate(time.Second))
	st.Members = memberStatuses(kvc, obs)
	if v.phase != kvc.Status.Phase || obs.readyMembers != kvc.Status.ReadyPartitions || st.LastProgressTime == nil ||
		membersMoved(kvc.Status.Members, st.Members) {
		st.LastProgressTime = &nowTime
	}
	st.Phase = v.phase
	st.ReadyPartitions = obs.readyMembers
	if ver := commonVersion(obs.cluster); ver != "" {
		st.CurrentVersion = ver
	}

	setCondition(&st, kvv1.ConditionReady, v.phase == kvv1.PhaseReady && v.reason == ReasonClusterReady, v.reason, v.message, kvc.Generation, nowTime)
	progressing := v.phase == kvv1.PhaseCreating || v.phase == kvv1.PhaseUpgrading
	reconcilingReason := v.reason
	if !progressing {
		reconcilingReason = ReasonIdle
	}
	setCondition(&st, kvv1.ConditionReconciling, progressing, reconcilingReason, v.message, kvc.Generation, nowTime)
	stalledReason, stalledMessage := ReasonNotFailed, "the operator is making progress"
	if v.phase == kvv1.PhaseFailed {
		stalledReason, stalledMessage = v.reason, v.message
	}
	setCondition(&st, kvv1.ConditionStalled, v.phase == kvv1.PhaseFailed, stalledReason, stalledMessage, kvc.Generation, nowTime)
	return st, v
}

// setCondition sets a condition on the status, moving lastTransitionTime only when the condition's
// status really changes.
func setCondition(st *kvv1.KVClusterStatus, condType string, status bool, reason, message string, generation int64, now metav1.Time) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: condType, Status: s, Reason: reason, Message: message,
		ObservedGeneration: generation, LastTransitionTime: now,
	})
}

// membersMoved reports progress of a rollout: a member joined, left, was promoted or changed version.
func membersMoved(before, after []kvv1.MemberStatus) bool {
	return !slices.EqualFunc(before, after, func(a, b kvv1.MemberStatus) bool {
		return a.Name == b.Name && a.ID == b.ID && a.Version == b.Version && a.Learner == b.Learner
	})
}

// memberStatuses is etcd's member list for status; when etcd did not answer, the last known list
// is kept with every member marked not healthy and no leader. A member seen healthy records the
// volume claim it runs on; a member not seen healthy keeps the one recorded before.
func memberStatuses(kvc *kvv1.KVCluster, obs observation) []kvv1.MemberStatus {
	previous, cluster := kvc.Status.Members, obs.cluster
	if cluster == nil {
		out := make([]kvv1.MemberStatus, len(previous))
		for i, m := range previous {
			m.Healthy, m.Leader = false, false
			out[i] = m
		}
		return out
	}
	out := make([]kvv1.MemberStatus, 0, len(cluster.Members))
	for _, m := range cluster.Members {
		name := m.Name
		if !m.Started() { // an added member is known by its peer URL until it runs
			if ord, ok := memberOrdinal(kvc, m); ok {
				name = specs.MemberName(kvc, ord)
			}
		}
		ms := kvv1.MemberStatus{
			Name: name, ID: fmt.Sprintf("%x", m.ID), Version: m.Version,
			Leader: m.Leader, Learner: m.Learner, Healthy: m.Healthy,
			VolumeUID: string(recordedVolume(kvc, name)),
		}
		if ord, ok := specs.OrdinalOfMember(kvc, name); ok && m.Healthy && m.Started() && obs.pods[ord].volumeUID != "" {
			ms.VolumeUID = string(obs.pods[ord].volumeUID)
		}
		out = append(out, ms)
	}
	return out
}

// commonVersion is the version every member reports, or "" while they differ or some did not answer.
func commonVersion(cluster *members.Cluster) string {
	if cluster == nil || !cluster.AllHealthy() {
		return ""
	}
	v := cluster.Members[0].Version
	for _, m := range cluster.Members[1:] {
		if m.Version != v {
			return ""
		}
	}
	return v
}
