// Package plan decides what the operator does with a KVCluster. Its functions are pure: from the
// cluster, one Observation and the time, Make returns the whole Plan — the status to write, the
// objects to apply, and the steps to take — so every decision is tested without an API server
// or etcd. The controllers package observes and acts; it decides nothing itself.
package plan

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// Config is what the operator was started with that decisions depend on.
type Config struct {
	// Images are the default etcd repository and the operator's own image (which Jobs run).
	Images specs.Images
}

// Plan is everything one reconcile of a live (not deleted) cluster does, in the order it is done.
type Plan struct {
	// Guard: the cluster has deletion steps, so it keeps a deletion guard (see specs.Guard).
	Guard bool
	// AdoptClaims are leftover volume claims the user asked to adopt (kvcluster.io/adopt-volumes).
	AdoptClaims []ClaimUpdate
	// TLS are the cluster's certificates to keep, issue or renew.
	TLS TLS
	// Children are the objects the cluster owns; nil when they may not be written.
	Children *Children
	// ExpandClaims are the members' claims to grow to storage.size.
	ExpandClaims []ClaimUpdate
	// Rollout is the one change to make to the running members; Action is ActWait when none.
	Rollout Rollout
	// Disarm are alarms the cluster inherited, to clear.
	Disarm []members.Alarm
	// FreeSpace is the next step of freeing space under a NOSPACE alarm.
	FreeSpace FreeSpace
	// Endpoints are the members' client URLs to ask.
	Endpoints []string
	// Backups are the backup Jobs to start and to prune.
	Backups Backups
	// Status is the whole status to write.
	Status kvv1.KVClusterStatus
	// Reason and Message explain the phase in Status.
	Reason, Message string
	// Events announce what changed in status (the phase, a finished backup, a bad schedule),
	// once, after it is written; each step act takes is announced as it is taken.
	Events []Event
	// RequeueAfter is when to look again if nothing else triggers a reconcile.
	RequeueAfter time.Duration
	// OnlyLooksAgain: the requeue carries nothing forward. The cluster is settled (Ready or Failed,
	// no space to free) or etcd did not answer, and no backup or certificate renewal falls due
	// before it. Such a reconcile waits in the work queue behind every cluster a watch event woke:
	// looking at an unreachable cluster holds a worker for the whole etcd timeout, and a fleet of
	// them must not delay a change anywhere else. Most changes that end such a state come as a
	// watch event (a pod, the StatefulSet, an owned object); those that do not (etcd answering
	// again with no pod changed, a leftover claim deleted, a deadline passing) are seen by the poll,
	// later while news keeps every worker busy.
	OnlyLooksAgain bool
}

// Children are what the objects the cluster owns are built from (see specs). The deletion
// guard's UID, an owner of several of them, is known only once the guard exists.
type Children struct {
	Membership specs.Membership
	// Set describes the StatefulSet; its Guard is filled in by whoever applies it.
	Set specs.MemberSet
	// DisruptionBase is the member count the PodDisruptionBudget protects.
	DisruptionBase int32
}

// Event is one event to record on the KVCluster.
type Event struct {
	Type, Reason, Action, Message string
}

// Make plans one reconcile of a cluster that is not being deleted.
func Make(kvc *kvv1.KVCluster, obs Observation, now time.Time, cfg Config) Plan {
	p := Plan{Guard: WantsFinalizer(kvc), Endpoints: obs.ClientURLs(kvc)}
	if kvc.Annotations[kvv1.AnnotationAdoptVolumes] == "true" && kvc.Spec.Restore == nil {
		// Adopted claims are labelled with this cluster's UID, so they stay its own once the
		// annotation is gone; they are no conflict now.
		p.AdoptClaims, obs.LeftoverClaims = adoptedClaims(kvc, obs, obs.LeftoverClaims), nil
	}
	p.TLS = planTLS(kvc, obs, now)
	obs.tlsProblem = p.TLS.Problem
	growth := planVolumeGrowth(kvc, obs)
	obs.volumeProblem = growth.problem
	volumeSize := recordedVolumeSize(kvc, obs)
	quota := membersQuota(kvc, obs, volumeSize)
	if !obs.conflicted() {
		membership, replicas := desiredMembership(kvc, obs)
		p.Children = &Children{
			Membership: membership,
			Set: specs.MemberSet{
				Images:           cfg.Images,
				Replicas:         replicas,
				Bootstrapping:    !bootstrapped(kvc, obs),
				UnlabelledClaims: obs.STSClaimsUnlabelled,
				Trust:            p.TLS.Trust,
				Transport:        templateTransport(kvc, obs),
				ClaimSize:        obs.STSClaimSize,
				Quota:            quota,
				AwaitedPods:      awaitedPods(obs, now),
			},
			DisruptionBase: disruptionBase(kvc, obs),
		}
		p.ExpandClaims = growth.expand
	}

	obs.Pods = restartsForResize(obs)
	ro := planRollout(kvc, obs)
	if !ro.Pending && bootstrapped(kvc, obs) {
		// Growing volumes is a change to the running cluster too: its progress is the rollout's,
		// up to the template with the new quota, whose restarts show from the next reconcile on.
		if growth.pending() {
			ro = wait(ReasonExpandingVolumes, "%s", growth.message(kvc))
		} else if grown, before := volumesGrown(kvc, obs, volumeSize); grown && before != quota {
			ro = wait(ReasonUpgrading, "every member's volume has %s: restarting the members to take a backend quota of %s", volumeSize.String(), sizeOf(quota))
		}
	}
	ro.Endpoint = specs.MemberClientURL(kvc, obs.ClientScheme(kvc), ro.Ordinal)
	st, v := decide(kvc, obs, ro, now)
	p.Reason, p.Message, p.RequeueAfter = v.reason, v.message, v.requeueAfter
	if v.phase == kvv1.PhaseUpgrading { // only a rollout acts on the members
		p.Rollout = ro
		if ro.Action == ActPreUpgradeBackup {
			p.Rollout.Job = specs.PreUpgradeBackupJob(kvc, obs.ClientScheme(kvc), cfg.Images.Operator, now)
		}
	}
	p.Disarm = staleAlarms(kvc, obs)
	var events []Event
	var untilBackup time.Duration
	startingBackup := ""
	if p.Rollout.Job != nil {
		startingBackup = *p.Rollout.Job.Name
	}
	p.Backups, events, untilBackup = planBackups(kvc, obs, &st, now, cfg.Images.Operator, startingBackup)
	due := false // the requeue is when something falls due, not a poll
	if untilBackup > 0 && untilBackup < p.RequeueAfter {
		p.RequeueAfter, due = untilBackup, true
	}
	if renew := p.TLS.NextRenewal(now); !renew.IsZero() && renew.Sub(now) < p.RequeueAfter {
		p.RequeueAfter, due = max(renew.Sub(now), time.Second), true
	}
	st.Certificates = certificateStatuses(kvc, obs)
	st.VolumeSize = volumeSize
	events = append(events, volumesGrownEvent(kvc, obs, volumeSize, quota)...)
	switch at := metav1.NewMicroTime(now.Truncate(time.Microsecond)); {
	case obs.Compacted > 0:
		st.LastCompaction = &kvv1.Compaction{Revision: obs.Compacted, Time: at}
	case obs.Disarmed && st.LastCompaction != nil && st.LastCompaction.DisarmedTime == nil:
		st.LastCompaction.DisarmedTime = &at
	}
	p.FreeSpace = planFreeSpace(kvc, obs, v.phase, p.Disarm, quotaOf(st, quota), now)
	// An open kvcluster.io/defragment-now request decides the defragmentation, not the routine;
	// under NOSPACE the operator frees space its own way, and the request waits.
	starting := startingBackup
	if p.Backups.Start != nil {
		starting = *p.Backups.Start.Name
	}
	step, ok, requestEvents := answerDefragmentRequest(kvc, obs, &st, v.phase, p.FreeSpace.Active, starting, now)
	if ok && !p.FreeSpace.Active {
		p.FreeSpace = step
	}
	events = append(events, requestEvents...)
	events = append(events, setSpacePressure(&st, kvc, obs, p.Disarm, p.FreeSpace, now)...)
	events = append(events, defragmentationScheduleProblem(kvc, now)...)
	spacePressure := meta.IsStatusConditionTrue(st.Conditions, kvv1.ConditionSpacePressure)
	if spacePressure {
		// Near the quota a database may reach it within the minute a healthy cluster is polled at.
		p.RequeueAfter = min(p.RequeueAfter, pollWhileProgressing)
	}
	p.Status = st
	p.Events = append(append(phaseEvents(kvc, v), events...), secureDefaultsUnset(kvc)...)
	settled := (v.phase == kvv1.PhaseReady || v.phase == kvv1.PhaseFailed) && !spacePressure
	p.OnlyLooksAgain = !due && (settled || obs.Cluster == nil)
	return p
}

// secureDefaultsUnset warns, on a new cluster's first reconcile, that it is plaintext because
// spec.tls is unset, or open to every pod because spec.networkPolicy is: the admission policies of
// deploy/default give new clusters both, so they were not installed or not in effect yet when
// this one was created.
func secureDefaultsUnset(kvc *kvv1.KVCluster) []Event {
	if kvc.Status.Phase != "" {
		return nil
	}
	var events []Event
	if kvc.Spec.TLS == nil {
		events = append(events, Event{Type: corev1.EventTypeWarning, Reason: EventTLSUnset, Action: "CheckTLS", Message: "spec.tls is unset, so the cluster is " +
			"plaintext: the admission policy deploy/default installs gives new clusters tls.mode Operator, and was not installed or not " +
			"in effect yet when this one was created. Set spec.tls.mode: Operator to move it to TLS, or Disabled to say plaintext is meant"})
	}
	if kvc.Spec.NetworkPolicy == nil {
		events = append(events, Event{Type: corev1.EventTypeWarning, Reason: EventNetworkPolicyUnset, Action: "CheckNetworkPolicy", Message: "spec.networkPolicy " +
			"is unset, so the cluster has no NetworkPolicy and any pod may reach its members: the admission policy deploy/default installs " +
			"gives new clusters networkPolicy.mode Managed, and was not installed or not in effect yet when this one was created. " +
			"Set spec.networkPolicy.mode: Managed to get one, or Disabled to say none is meant"})
	}
	return events
}

// FinalizerChange says whether the deletion finalizer must be added (want true) or removed (want
// false). It depends on the spec alone, so it is applied before anything is observed: a cluster
// deleted right after its creation must already hold it.
func FinalizerChange(kvc *kvv1.KVCluster) (want, change bool) {
	want = WantsFinalizer(kvc)
	return want, slices.Contains(kvc.Finalizers, kvv1.FinalizerFinalBackup) != want
}

// phaseEvents announce a phase change, and a problem that needs a person, once.
func phaseEvents(kvc *kvv1.KVCluster, v verdict) []Event {
	eventType := corev1.EventTypeNormal
	if v.phase == kvv1.PhaseFailed || warningReasons[v.reason] {
		eventType = corev1.EventTypeWarning
	}
	action := "Phase" + string(v.phase)
	switch {
	case v.phase != kvc.Status.Phase:
		return []Event{{Type: eventType, Reason: v.reason, Action: action, Message: v.message}}
	case warningReasons[v.reason] && v.reason != previousReason(kvc):
		// A problem that needs a person can arise without a phase change: say so once.
		return []Event{{Type: corev1.EventTypeWarning, Reason: v.reason, Action: action, Message: v.message}}
	}
	return nil
}

// previousReason is the reason of the verdict the last status recorded (the Ready condition
// always carries it).
func previousReason(kvc *kvv1.KVCluster) string {
	if c := meta.FindStatusCondition(kvc.Status.Conditions, kvv1.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

// staleAlarms are the alarms a cluster inherited: those of members it does not have and, while a
// restored cluster forms, every alarm (restored under the same name, its members have the IDs of
// the cluster the backup came from). A final backup is taken with writes fenced by a NOSPACE
// alarm, which the snapshot carries: a restored cluster would refuse writes for ever. A real
// NOSPACE alarm comes back by itself on the next write over the quota.
func staleAlarms(kvc *kvv1.KVCluster, obs Observation) []members.Alarm {
	if obs.Cluster == nil || !obs.Cluster.HasLeader {
		return nil
	}
	if kvc.Spec.Restore != nil && (kvc.Status.Phase == "" || kvc.Status.Phase == kvv1.PhaseCreating) {
		return obs.Cluster.Alarms
	}
	return obs.Cluster.StaleAlarms()
}
