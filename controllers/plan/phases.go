package plan

import (
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// How often a cluster is looked at again when nothing else triggers a reconcile: etcd's health
// is not a Kubernetes object, so it is polled.
const (
	pollWhileProgressing = 5 * time.Second
	pollWhileHealthy     = time.Minute
	pollWhileFailed      = 30 * time.Second
	// A cluster that waits for a change the operator watches, which wakes it: a Creating one none
	// of whose members' etcd runs yet (creatingPoll), a rollout waiting for a member pod
	// (rolloutPoll), a Ready one whose down members wait for theirs (degradedPoll).
	pollWhileAwaitingEvent = 30 * time.Second
)

// verdict is what a phase function decided.
type verdict struct {
	phase        kvv1.Phase
	reason       string
	message      string
	requeueAfter time.Duration
}

// phaseFunc decides the next phase from the current one. Each phase is one small function; the
// phase itself is persisted in status, so a restarted operator resumes where it was.
type phaseFunc func(kvc *kvv1.KVCluster, obs Observation, ro Rollout, now time.Time) verdict

var phaseFuncs = map[kvv1.Phase]phaseFunc{
	kvv1.PhaseCreating:  creating,
	kvv1.PhaseReady:     ready,
	kvv1.PhaseUpgrading: upgrading,
	kvv1.PhaseFailed:    failed,
}

// creating waits for every member and for etcd to agree on a healthy cluster of the right size.
func creating(kvc *kvv1.KVCluster, obs Observation, ro Rollout, now time.Time) verdict {
	if obs.healthy(kvc) {
		return ready(kvc, obs, ro, now)
	}
	reason, summary := obs.waitingForMembers(kvc, ReasonCreating)
	if deadlinePassed(kvc, now) {
		return verdict{kvv1.PhaseFailed, ReasonProgressDeadline, fmt.Sprintf(
			"the cluster did not become ready within %ds (%s). Check the member pods' events and logs "+
				"(kubectl describe pods -l app.kubernetes.io/instance=%s), fix the cause, then change the spec "+
				"or delete and re-create the KVCluster", kvc.Spec.ProgressDeadlineSeconds, summary, kvc.Name),
			pollWhileFailed}
	}
	return verdict{kvv1.PhaseCreating, reason, summary, creatingPoll(kvc, obs, now)}
}

// creatingPoll is when a Creating cluster is looked at again. While no member's etcd runs (and none
// answered) there is nothing to ask, and what changes that (a pod made, its etcd container started,
// a pod Ready) wakes the cluster as a pod event. The poll is left the progress deadline, which it
// never passes by, and what no watch sees while the cluster is Creating: a ServiceAccount or
// PriorityClass spec.pods names being created (the pods then made wake it anyway; until then the
// condition may name it as missing for up to 30 s). (Leftover claims, someone else's objects and
// unusable TLS Secrets make the cluster Failed, polled every 30 s as before.) A thousand clusters
// created at once took minutes to get their pods scheduled; a poll of each every 5 s meanwhile
// would make about the 51.6 reconciles per cluster the fleet benchmark counted at N=1000 (an
// estimate from the poll interval: not yet measured again at N=1000).
func creatingPoll(kvc *kvv1.KVCluster, obs Observation, now time.Time) time.Duration {
	if obs.Cluster != nil || obs.memberRuns() {
		return pollWhileProgressing
	}
	return pollAwaitingEvent(kvc, obs, now)
}

// rolloutPoll is when a cluster whose rollout is pending is looked at again: every 5 s while what
// it waits for only etcd shows (a member healthy, caught up), which is polled; while it waits for a
// member pod to come, go or turn Ready, or for the StatefulSet controller (Rollout.AwaitsEvent),
// that change wakes it. Through a thousand clusters' upgrade on the fleet benchmark's simulated
// control plane, where a member pod took minutes to come back, polls every 5 s made 59.7
// reconciles per cluster and kept the operator's 32 workers busy.
func rolloutPoll(kvc *kvv1.KVCluster, obs Observation, ro Rollout, now time.Time) time.Duration {
	if !ro.AwaitsEvent {
		return pollWhileProgressing
	}
	return pollAwaitingEvent(kvc, obs, now)
}

// pollAwaitingEvent is the poll of a cluster an event it awaits will wake: rare, but never later
// than just past a progress deadline still to come. While a claim of the cluster is being deleted
// (a member's volume reset), every 5 s: no watch shows the claim gone, and a member pod the
// StatefulSet controller could not make meanwhile waits for the operator to notice (awaitedPods).
func pollAwaitingEvent(kvc *kvv1.KVCluster, obs Observation, now time.Time) time.Duration {
	if len(obs.ClaimsBeingDeleted) > 0 {
		return pollWhileProgressing
	}
	if deadline, ok := progressDeadline(kvc); ok && !deadline.Before(now) && deadline.Sub(now) < pollWhileAwaitingEvent {
		return deadline.Sub(now) + time.Second // just past it
	}
	return pollWhileAwaitingEvent
}

// waitingForMembers is the reason and message of waiting for members that are not all there: the
// reason given, or, while a member has no pod, ReasonPodsNotCreatable naming why it cannot have one.
func (o Observation) waitingForMembers(kvc *kvv1.KVCluster, reason string) (string, string) {
	if why := o.missingReferences(); why != "" && o.memberPodMissing(kvc) {
		return ReasonPodsNotCreatable, o.summary(kvc) + "; member pods cannot be created: " + why
	}
	return reason, o.summary(kvc)
}

// ready watches a formed cluster. Losing members is reported on the Ready condition while the
// StatefulSet brings pods back; only a quorum lost for longer than the deadline needs a person.
func ready(kvc *kvv1.KVCluster, obs Observation, ro Rollout, now time.Time) verdict {
	switch {
	case ro.Reason == ReasonUnknownMember: // not a change the operator makes: a person's to remove
		return verdict{kvv1.PhaseReady, ReasonUnknownMember, ro.Message, pollWhileProgressing}
	case ro.Pending && ro.Reason != ReasonMembershipUnknown:
		return verdict{kvv1.PhaseUpgrading, ro.Reason, ro.Message, rolloutPoll(kvc, obs, ro, now)}
	}
	if obs.healthy(kvc) {
		return verdict{kvv1.PhaseReady, ReasonClusterReady, obs.summary(kvc) + "; etcd is healthy", pollWhileHealthy}
	}
	if !obs.quorumLost() && len(obs.Cluster.Alarms) > 0 { // the SpacePressure condition says what to do about NOSPACE
		return verdict{kvv1.PhaseReady, ReasonWritesRefused, obs.summary(kvc) + "; etcd refuses writes while an alarm is active", pollWhileProgressing}
	}
	reason, summary := obs.waitingForMembers(kvc, ReasonMembersUnavailable)
	if obs.quorumLost() && deadlinePassed(kvc, now) {
		return verdict{kvv1.PhaseFailed, ReasonQuorumLost, fmt.Sprintf(
			"etcd has had no quorum for more than %ds (%s). If the lost members cannot come back, "+
				"create a new KVCluster restored from the latest backup", kvc.Spec.ProgressDeadlineSeconds, summary),
			pollWhileFailed}
	}
	return verdict{kvv1.PhaseReady, reason, summary, degradedPoll(kvc, obs, now)}
}

// degradedPoll is when a Ready cluster with members down is looked at again: every 5 s while etcd
// may show the way back (a member whose pod is Ready yet etcd does not call it healthy, a quorum
// lost while a member's etcd runs); while each member etcd does not call healthy waits for its
// pod to come back, go or turn Ready (a node gone, a pod rescheduled), or no member's etcd runs,
// those pods' changes wake it (pollAwaitingEvent).
func degradedPoll(kvc *kvv1.KVCluster, obs Observation, now time.Time) time.Duration {
	if obs.quorumLost() {
		if obs.memberRuns() {
			return pollWhileProgressing
		}
		return pollAwaitingEvent(kvc, obs, now)
	}
	for _, m := range obs.Cluster.Members {
		if ord, ok := MemberOrdinal(kvc, m); !ok || !m.Healthy && !obs.podAwaited(ord) {
			return pollWhileProgressing
		}
	}
	return pollAwaitingEvent(kvc, obs, now)
}

// upgrading changes a running cluster one step per reconcile (see planRollout) until it matches
// the spec. A rollout that makes no progress for longer than the deadline needs a person.
func upgrading(kvc *kvv1.KVCluster, obs Observation, ro Rollout, now time.Time) verdict {
	if !ro.Pending {
		return ready(kvc, obs, ro, now)
	}
	if deadlinePassed(kvc, now) && !volumesMoved(kvc, ro.Reason, ro.Message) {
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
			what, kvc.Spec.ProgressDeadlineSeconds, ro.Message, obs.summary(kvc), kvc.Name, undo),
			pollWhileFailed}
	}
	return verdict{kvv1.PhaseUpgrading, ro.Reason, ro.Message, rolloutPoll(kvc, obs, ro, now)}
}

func orUnknown(s string) string {
	if s == "" {
		return "the previous version"
	}
	return s
}

// failed keeps the cluster Failed until a person changes the spec, or the cluster heals itself.
func failed(kvc *kvv1.KVCluster, obs Observation, ro Rollout, now time.Time) verdict {
	if c := meta.FindStatusCondition(kvc.Status.Conditions, kvv1.ConditionStalled); c != nil && blockingReasons[c.Reason] { // and it is resolved
		if bootstrapped(kvc, obs) {
			return ready(kvc, obs, ro, now)
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
	if obs.healthy(kvc) && !ro.Pending {
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
	deadline, ok := progressDeadline(kvc)
	return ok && now.After(deadline)
}

// progressDeadline is when the cluster's progress deadline passes; none before it made progress.
func progressDeadline(kvc *kvv1.KVCluster) (time.Time, bool) {
	if kvc.Status.LastProgressTime == nil {
		return time.Time{}, false
	}
	deadline := time.Duration(kvc.Spec.ProgressDeadlineSeconds) * time.Second
	if deadline <= 0 {
		deadline = 600 * time.Second
	}
	return kvc.Status.LastProgressTime.Add(deadline), true
}

// decide computes the next full status of a cluster from what was observed. The same inputs
// always give the same status, and every field (and condition transition time) whose value did
// not change is left as it was, so an idle reconcile has nothing to write.
func decide(kvc *kvv1.KVCluster, obs Observation, ro Rollout, now time.Time) (kvv1.KVClusterStatus, verdict) {
	fn, ok := phaseFuncs[kvc.Status.Phase]
	if !ok { // a new cluster, or a phase this release does not drive
		fn = creating
	}
	v, blocked := blockedVerdict(kvc, obs)
	if !blocked {
		v = fn(kvc, obs, ro, now)
	}

	st := *kvc.Status.DeepCopy()
	st.ObservedGeneration = kvc.Generation
	st.ClientEndpoint = specs.ClientEndpoint(kvc, obs.ClientScheme(kvc))
	st.Members = memberStatuses(kvc, obs, now)
	st.BackendQuota = backendQuota(kvc, obs)
	if v.phase != kvc.Status.Phase || obs.ReadyMembers != kvc.Status.ReadyPartitions || st.LastProgressTime == nil ||
		membersMoved(kvc.Status.Members, st.Members) || volumesMoved(kvc, v.reason, v.message) {
		at := metav1.NewTime(now.Truncate(time.Second))
		st.LastProgressTime = &at
	}
	st.Phase = v.phase
	st.ReadyPartitions = obs.ReadyMembers
	if ver := commonVersion(obs.Cluster); ver != "" {
		st.CurrentVersion = ver
	}

	SetCondition(&st, kvc, kvv1.ConditionReady, v.phase == kvv1.PhaseReady && v.reason == ReasonClusterReady, v.reason, v.message, now)
	progressing := v.phase == kvv1.PhaseCreating || v.phase == kvv1.PhaseUpgrading
	reconcilingReason := v.reason
	if !progressing {
		reconcilingReason = ReasonIdle
	}
	SetCondition(&st, kvc, kvv1.ConditionReconciling, progressing, reconcilingReason, v.message, now)
	stalledReason, stalledMessage := ReasonNotFailed, "the operator is making progress"
	if v.phase == kvv1.PhaseFailed {
		stalledReason, stalledMessage = v.reason, v.message
	}
	SetCondition(&st, kvc, kvv1.ConditionStalled, v.phase == kvv1.PhaseFailed, stalledReason, stalledMessage, now)
	return st, v
}

// membersMoved reports progress of a rollout: a member joined, left, was promoted or changed version.
func membersMoved(before, after []kvv1.MemberStatus) bool {
	return !slices.EqualFunc(before, after, func(a, b kvv1.MemberStatus) bool {
		return a.Name == b.Name && a.ID == b.ID && a.Version == b.Version && a.Learner == b.Learner
	})
}

// volumesMoved reports progress of a volume expansion: a claim moved on (its message names where
// each claim is), so a slow provisioner is not taken for a stalled rollout.
func volumesMoved(kvc *kvv1.KVCluster, reason, message string) bool {
	c := meta.FindStatusCondition(kvc.Status.Conditions, kvv1.ConditionReconciling)
	return reason == ReasonExpandingVolumes && c != nil && c.Reason == ReasonExpandingVolumes && c.Message != message
}

// memberStatuses is etcd's member list for status; when etcd did not answer, the last known list
// is kept with every member marked not healthy and no leader. A member seen healthy records the
// volume claim it runs on; a member not seen healthy keeps the one recorded before, and its sizes.
// The member defragmented in this reconcile (Observation.Defragmented) records the time.
func memberStatuses(kvc *kvv1.KVCluster, obs Observation, now time.Time) []kvv1.MemberStatus {
	previous, cluster := kvc.Status.Members, obs.Cluster
	if cluster == nil {
		out := make([]kvv1.MemberStatus, len(previous))
		for i, m := range previous {
			m.Healthy, m.Leader, m.Alarms = false, false, nil // alarms unknown, as is health
			out[i] = m
		}
		return out
	}
	out := make([]kvv1.MemberStatus, 0, len(cluster.Members))
	for _, m := range cluster.Members {
		name := memberPodName(kvc, m)
		ms := kvv1.MemberStatus{
			Name: name, ID: fmt.Sprintf("%x", m.ID), Version: m.Version,
			Leader: m.Leader, Learner: m.Learner, Healthy: m.Healthy,
			VolumeUID: string(recordedVolume(kvc, m)), Alarms: memberAlarms(cluster, m.ID),
		}
		prev := recordedMember(kvc, name)
		if prev != nil && prev.ID != ms.ID { // a former member's
			prev = nil
		}
		if m.Healthy {
			ms.DBSize, ms.DBSizeInUse = mebibytes(m.DBSize), mebibytes(m.DBSizeInUse)
		} else if prev != nil { // sizes as last seen
			ms.DBSize, ms.DBSizeInUse = prev.DBSize, prev.DBSizeInUse
		}
		switch {
		case name == obs.Defragmented:
			at := metav1.NewMicroTime(now.Truncate(time.Microsecond))
			ms.LastDefragmentTime = &at
		case prev != nil:
			ms.LastDefragmentTime = prev.LastDefragmentTime
		}
		if ord, ok := specs.OrdinalOfMember(kvc, name); ok && m.Healthy && m.Started() && obs.Pods[ord].VolumeUID != "" {
			ms.VolumeUID = string(obs.Pods[ord].VolumeUID)
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
