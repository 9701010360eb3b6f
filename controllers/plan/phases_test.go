package plan

import (
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/members/memberstest"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// kvcIn is a 3-member cluster kv in namespace ns whose status is in phase, with its last progress
// progressAgo before t0; no status at all for phase "".
func kvcIn(phase kvv1.Phase, progressAgo time.Duration) *kvv1.KVCluster {
	kvc := &kvv1.KVCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "kv", Namespace: "ns", Generation: 1, UID: "uid-kv", CreationTimestamp: metav1.NewTime(t0.Add(-time.Hour))},
		Spec:       kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 3, ProgressDeadlineSeconds: 600},
	}
	if phase != "" {
		p := metav1.NewTime(t0.Add(-progressAgo))
		kvc.Status = kvv1.KVClusterStatus{Phase: phase, ObservedGeneration: 1, LastProgressTime: &p}
	}
	return kvc
}

// etcdOf is etcd's answer for n healthy members of kv on version, changed by change.
func etcdOf(n int, version string, change func(c *members.Cluster)) *members.Cluster {
	c := memberstest.Healthy(kvcIn("", 0), n, version)
	if change != nil {
		change(&c)
	}
	return &c
}

func TestDecidePhaseTransitions(t *testing.T) {
	noQuorum := errors.New("no quorum")
	healthy := etcdOf(3, "3.7.3", nil)
	mixed := etcdOf(3, "3.7.3", func(c *members.Cluster) { c.Members[2].Version = "3.6.16" })
	withLearner := etcdOf(3, "3.7.3", func(c *members.Cluster) { c.Members[2].Learner = true })
	oneDown := etcdOf(3, "3.7.3", func(c *members.Cluster) { c.Members[1].Healthy = false })
	rolling := Rollout{Pending: true, Action: ActWait, Reason: ReasonUpgrading, Message: "1/3 members on 3.7.4; waiting for member kv-1 to be healthy"}
	specChanged := kvcIn(kvv1.PhaseFailed, time.Hour)
	specChanged.Generation, specChanged.Status.CurrentVersion = 2, "3.6.16"

	tests := []struct {
		name        string
		kvc         *kvv1.KVCluster
		obs         Observation
		rollout     Rollout
		wantPhase   kvv1.Phase
		wantReason  string
		wantReady   bool
		wantStalled bool
		wantRecon   bool
		wantVersion string
		wantMessage string // a part of the verdict's message
	}{
		{name: "new cluster starts Creating", kvc: kvcIn("", 0), obs: Observation{EtcdErr: errors.New("no member pods exist yet")},
			wantPhase: kvv1.PhaseCreating, wantReason: ReasonCreating, wantRecon: true},
		{name: "creating: all members ready and etcd healthy -> Ready", kvc: kvcIn(kvv1.PhaseCreating, time.Minute),
			obs:       Observation{ReadyMembers: 3, Cluster: healthy},
			wantPhase: kvv1.PhaseReady, wantReason: ReasonClusterReady, wantReady: true, wantVersion: "3.7.3"},
		{name: "creating: pods ready but etcd not answering stays Creating", kvc: kvcIn(kvv1.PhaseCreating, time.Minute),
			obs:       Observation{ReadyMembers: 3, EtcdErr: noQuorum},
			wantPhase: kvv1.PhaseCreating, wantReason: ReasonCreating, wantRecon: true},
		{name: "creating: pods ready but one member not answering", kvc: kvcIn(kvv1.PhaseCreating, time.Minute),
			obs:       Observation{ReadyMembers: 3, Cluster: oneDown},
			wantPhase: kvv1.PhaseCreating, wantReason: ReasonCreating, wantRecon: true},
		{name: "creating: a learner is not a voting member", kvc: kvcIn(kvv1.PhaseCreating, time.Minute),
			obs:       Observation{ReadyMembers: 3, Cluster: withLearner},
			wantPhase: kvv1.PhaseCreating, wantReason: ReasonCreating, wantRecon: true, wantVersion: "3.7.3"},
		{name: "creating: too few members in etcd", kvc: kvcIn(kvv1.PhaseCreating, time.Minute),
			obs:       Observation{ReadyMembers: 3, Cluster: etcdOf(2, "3.7.3", nil)},
			wantPhase: kvv1.PhaseCreating, wantReason: ReasonCreating, wantRecon: true, wantVersion: "3.7.3"},
		{name: "creating: an alarm keeps it from Ready", kvc: kvcIn(kvv1.PhaseCreating, time.Minute),
			obs: Observation{ReadyMembers: 3, Cluster: etcdOf(3, "3.7.3", func(c *members.Cluster) {
				c.Alarms = []members.Alarm{{MemberID: 1, Type: "NOSPACE"}}
			})},
			wantPhase: kvv1.PhaseCreating, wantReason: ReasonCreating, wantRecon: true, wantVersion: "3.7.3"},
		{name: "creating: no progress past the deadline -> Failed", kvc: kvcIn(kvv1.PhaseCreating, 11*time.Minute),
			obs:       Observation{ReadyMembers: 1, EtcdErr: noQuorum},
			wantPhase: kvv1.PhaseFailed, wantReason: ReasonProgressDeadline, wantStalled: true},
		{name: "creating: member pods that cannot be created say why", kvc: kvcIn(kvv1.PhaseCreating, time.Minute),
			obs:       Observation{ReadyMembers: 0, EtcdErr: noQuorum, MissingPodReferences: []string{"ServiceAccount etcd-backups"}},
			wantPhase: kvv1.PhaseCreating, wantReason: ReasonPodsNotCreatable, wantRecon: true,
			wantMessage: "member pods cannot be created: spec.pods names ServiceAccount etcd-backups, which does not exist"},
		{name: "creating: past the deadline, Failed still says why", kvc: kvcIn(kvv1.PhaseCreating, 11*time.Minute),
			obs:       Observation{ReadyMembers: 0, EtcdErr: noQuorum, MissingPodReferences: []string{"ServiceAccount etcd-backups"}},
			wantPhase: kvv1.PhaseFailed, wantReason: ReasonProgressDeadline, wantStalled: true, wantMessage: "spec.pods names ServiceAccount etcd-backups"},
		{name: "ready stays Ready when healthy", kvc: kvcIn(kvv1.PhaseReady, time.Hour),
			obs:       Observation{ReadyMembers: 3, Cluster: healthy},
			wantPhase: kvv1.PhaseReady, wantReason: ReasonClusterReady, wantReady: true, wantVersion: "3.7.3"},
		{name: "ready: a member down keeps quorum -> Ready phase, Ready=False", kvc: kvcIn(kvv1.PhaseReady, time.Hour),
			obs:       Observation{ReadyMembers: 2, Cluster: oneDown},
			wantPhase: kvv1.PhaseReady, wantReason: ReasonMembersUnavailable},
		{name: "ready: a member whose pod cannot be created says why", kvc: kvcIn(kvv1.PhaseReady, time.Hour),
			obs:       Observation{ReadyMembers: 2, Cluster: oneDown, MissingPodReferences: []string{"ServiceAccount a", "PriorityClass b"}},
			wantPhase: kvv1.PhaseReady, wantReason: ReasonPodsNotCreatable, wantMessage: "spec.pods names ServiceAccount a and PriorityClass b"},
		{name: "ready: with every member's pod there, references a roll lacks are not why members are down", kvc: kvcIn(kvv1.PhaseReady, time.Hour),
			obs: Observation{ReadyMembers: 2, Cluster: oneDown, MissingPodReferences: []string{"ServiceAccount a"},
				Pods: map[int]Pod{0: {Ready: true}, 1: {}, 2: {Ready: true}}},
			wantPhase: kvv1.PhaseReady, wantReason: ReasonMembersUnavailable},
		{name: "ready: quorum lost within the deadline waits", kvc: kvcIn(kvv1.PhaseReady, time.Minute),
			obs:       Observation{ReadyMembers: 1, EtcdErr: noQuorum},
			wantPhase: kvv1.PhaseReady, wantReason: ReasonMembersUnavailable},
		{name: "ready: quorum lost past the deadline -> Failed", kvc: kvcIn(kvv1.PhaseReady, 11*time.Minute),
			obs:       Observation{ReadyMembers: 1, EtcdErr: noQuorum},
			wantPhase: kvv1.PhaseFailed, wantReason: ReasonQuorumLost, wantStalled: true},
		{name: "ready: members on different versions keep the old currentVersion", kvc: kvcIn(kvv1.PhaseReady, time.Hour),
			obs:       Observation{ReadyMembers: 3, Cluster: mixed},
			wantPhase: kvv1.PhaseReady, wantReason: ReasonClusterReady, wantReady: true},
		{name: "ready: an unknown member is a person's to remove", kvc: kvcIn(kvv1.PhaseReady, time.Hour),
			obs:       Observation{ReadyMembers: 3, Cluster: healthy},
			rollout:   Rollout{Pending: true, Reason: ReasonUnknownMember, Message: "etcd has a member that is none of this cluster's pods"},
			wantPhase: kvv1.PhaseReady, wantReason: ReasonUnknownMember, wantVersion: "3.7.3"},
		{name: "failed: healing by itself -> Ready", kvc: kvcIn(kvv1.PhaseFailed, time.Hour),
			obs:       Observation{ReadyMembers: 3, Cluster: healthy},
			wantPhase: kvv1.PhaseReady, wantReason: ReasonClusterReady, wantReady: true, wantVersion: "3.7.3"},
		{name: "ready: a pending rollout -> Upgrading", kvc: kvcIn(kvv1.PhaseReady, time.Hour),
			obs: Observation{ReadyMembers: 3, Cluster: healthy}, rollout: rolling,
			wantPhase: kvv1.PhaseUpgrading, wantReason: ReasonUpgrading, wantRecon: true, wantVersion: "3.7.3"},
		{name: "ready: no quorum and unknown work stays Ready", kvc: kvcIn(kvv1.PhaseReady, time.Minute),
			obs: Observation{ReadyMembers: 1, EtcdErr: noQuorum}, rollout: Rollout{Pending: true, Reason: ReasonMembershipUnknown},
			wantPhase: kvv1.PhaseReady, wantReason: ReasonMembersUnavailable},
		{name: "upgrading: making progress", kvc: kvcIn(kvv1.PhaseUpgrading, time.Minute),
			obs: Observation{ReadyMembers: 2, Cluster: oneDown}, rollout: rolling,
			wantPhase: kvv1.PhaseUpgrading, wantReason: ReasonUpgrading, wantRecon: true},
		{name: "upgrading: nothing left -> Ready", kvc: kvcIn(kvv1.PhaseUpgrading, time.Minute),
			obs:       Observation{ReadyMembers: 3, Cluster: etcdOf(3, "3.7.4", nil)},
			wantPhase: kvv1.PhaseReady, wantReason: ReasonClusterReady, wantReady: true, wantVersion: "3.7.4"},
		{name: "upgrading: no progress past the deadline -> Failed", kvc: kvcIn(kvv1.PhaseUpgrading, 11*time.Minute),
			obs: Observation{ReadyMembers: 2, Cluster: oneDown}, rollout: rolling,
			wantPhase: kvv1.PhaseFailed, wantReason: ReasonRolloutStalled, wantStalled: true},
		{name: "upgrading: quorum lost past the deadline -> Failed", kvc: kvcIn(kvv1.PhaseUpgrading, 11*time.Minute),
			obs: Observation{ReadyMembers: 1, EtcdErr: noQuorum}, rollout: rolling,
			wantPhase: kvv1.PhaseFailed, wantReason: ReasonQuorumLost, wantStalled: true},
		{name: "failed: a spec change on a formed cluster -> Upgrading", kvc: specChanged,
			obs: Observation{ReadyMembers: 2, Cluster: oneDown}, rollout: rolling,
			wantPhase: kvv1.PhaseUpgrading, wantReason: ReasonSpecChanged, wantRecon: true, wantVersion: "3.6.16"},
		{name: "failed: stays Failed while nothing changes", kvc: kvcIn(kvv1.PhaseFailed, time.Hour),
			obs:       Observation{ReadyMembers: 0, EtcdErr: noQuorum},
			wantPhase: kvv1.PhaseFailed, wantReason: ReasonProgressDeadline, wantStalled: true},
		{name: "someone else's objects stop any phase", kvc: kvcIn(kvv1.PhaseReady, time.Hour),
			obs:       Observation{ReadyMembers: 3, Cluster: healthy, ForeignChildren: []string{"Service kv-client (not created by this KVCluster)"}},
			wantPhase: kvv1.PhaseFailed, wantReason: ReasonObjectConflict, wantStalled: true, wantVersion: "3.7.3"},
		{name: "a refused apply stops it until the refusal is lifted", kvc: kvcIn(kvv1.PhaseReady, time.Hour),
			obs:       Observation{ReadyMembers: 3, Cluster: healthy, ApplyRejected: "forbidden"},
			wantPhase: kvv1.PhaseFailed, wantReason: ReasonApplyRejected, wantStalled: true, wantVersion: "3.7.3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, v := decide(tt.kvc, tt.obs, tt.rollout, t0)
			if st.Phase != tt.wantPhase || v.reason != tt.wantReason {
				t.Fatalf("phase/reason = %s/%s, want %s/%s (%s)", st.Phase, v.reason, tt.wantPhase, tt.wantReason, v.message)
			}
			for cond, want := range map[string]bool{kvv1.ConditionReady: tt.wantReady, kvv1.ConditionStalled: tt.wantStalled, kvv1.ConditionReconciling: tt.wantRecon} {
				if got := meta.IsStatusConditionTrue(st.Conditions, cond); got != want {
					t.Errorf("condition %s = %v, want %v", cond, got, want)
				}
			}
			if !strings.Contains(v.message, tt.wantMessage) {
				t.Errorf("message %q, want it to contain %q", v.message, tt.wantMessage)
			}
			if st.CurrentVersion != tt.wantVersion {
				t.Errorf("currentVersion = %q, want %q", st.CurrentVersion, tt.wantVersion)
			}
			if st.ObservedGeneration != tt.kvc.Generation || st.ReadyPartitions != tt.obs.ReadyMembers || st.ClientEndpoint != "http://kv-client.ns.svc:2379" {
				t.Errorf("observedGeneration/readyPartitions/clientEndpoint = %d/%d/%s", st.ObservedGeneration, st.ReadyPartitions, st.ClientEndpoint)
			}
		})
	}
}

func TestDecideFailedLeavesOnSpecChange(t *testing.T) {
	kvc := kvcIn(kvv1.PhaseCreating, 11*time.Minute)
	st, _ := decide(kvc, Observation{EtcdErr: errors.New("down")}, Rollout{}, t0)
	if st.Phase != kvv1.PhaseFailed {
		t.Fatalf("phase = %s, want Failed", st.Phase)
	}
	stalled := meta.FindStatusCondition(st.Conditions, kvv1.ConditionStalled)

	kvc.Status = st
	st2, v := decide(kvc, Observation{EtcdErr: errors.New("still down")}, Rollout{}, t0.Add(time.Minute))
	if st2.Phase != kvv1.PhaseFailed || v.message != stalled.Message {
		t.Errorf("an unchanged spec must keep Failed with its first explanation, got %s %q", st2.Phase, v.message)
	}

	kvc.Generation = 2 // a person edited the spec
	st3, v := decide(kvc, Observation{EtcdErr: errors.New("still down")}, Rollout{}, t0.Add(2*time.Minute))
	if st3.Phase != kvv1.PhaseCreating || v.reason != ReasonSpecChanged {
		t.Fatalf("after a spec change phase = %s (%s), want Creating", st3.Phase, v.reason)
	}
	if !st3.LastProgressTime.Time.Equal(t0.Add(2 * time.Minute)) {
		t.Errorf("a new attempt must restart the progress deadline, lastProgressTime = %v", st3.LastProgressTime)
	}
}

// A Creating cluster with no member's etcd running is polled rarely (pod events wake it), yet never
// later than its progress deadline; once a member runs, often.
func TestCreatingLooksAgain(t *testing.T) {
	noQuorum := errors.New("no quorum")
	starting := map[int]Pod{0: {}, 1: {}, 2: {}}
	oneRuns := map[int]Pod{0: {Running: true}, 1: {}, 2: {}}
	for _, tt := range []struct {
		name        string
		progressAgo time.Duration // of the 10-minute deadline
		obs         Observation
		want        time.Duration
	}{
		{"no pod yet", time.Minute, Observation{EtcdErr: errors.New("no member pods exist yet")}, pollWhileAwaitingEvent},
		{"pods made, no etcd runs", time.Minute, Observation{Pods: starting, EtcdErr: noQuorum}, pollWhileAwaitingEvent},
		{"no etcd runs, the deadline in 10s", 9*time.Minute + 50*time.Second, Observation{Pods: starting, EtcdErr: noQuorum}, 11 * time.Second},
		{"no etcd runs, the deadline in 100ms", 10*time.Minute - 100*time.Millisecond, Observation{Pods: starting, EtcdErr: noQuorum}, 1100 * time.Millisecond},
		{"a member's etcd runs", time.Minute, Observation{Pods: oneRuns, EtcdErr: noQuorum}, pollWhileProgressing},
		{"no etcd runs, a member's claim is being deleted", time.Minute, Observation{Pods: starting, EtcdErr: noQuorum, ClaimsBeingDeleted: []int{2}}, pollWhileProgressing},
		{"etcd answers before a pod is seen running", time.Minute, Observation{Pods: starting, Cluster: etcdOf(3, "3.7.3", func(c *members.Cluster) {
			c.Members[1].Healthy = false
		})}, pollWhileProgressing},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kvc := kvcIn(kvv1.PhaseCreating, tt.progressAgo)
			if v := creating(kvc, tt.obs, Rollout{}, t0); v.phase != kvv1.PhaseCreating || v.requeueAfter != tt.want {
				t.Errorf("%s, looks again after %s; want Creating, after %s", v.phase, v.requeueAfter, tt.want)
			}
		})
	}
}

// A rollout that waits for a change the operator watches is polled rarely, yet never later than
// its progress deadline; one that waits for what only etcd shows, often.
func TestUpgradingLooksAgain(t *testing.T) {
	podAwaited := Rollout{Pending: true, Action: ActWait, Reason: ReasonUpgrading, AwaitsEvent: true}
	etcdAwaited := Rollout{Pending: true, Action: ActWait, Reason: ReasonUpgrading}
	for _, tt := range []struct {
		name               string
		phase              kvv1.Phase
		progressAgo        time.Duration // of the 10-minute deadline
		ro                 Rollout
		claimsBeingDeleted []int
		want               time.Duration
	}{
		{"a member pod awaited", kvv1.PhaseUpgrading, time.Minute, podAwaited, nil, pollWhileAwaitingEvent},
		{"a member pod awaited, the deadline in 10s", kvv1.PhaseUpgrading, 9*time.Minute + 50*time.Second, podAwaited, nil, 11 * time.Second},
		{"a member pod awaited while a claim is being deleted", kvv1.PhaseUpgrading, time.Minute, podAwaited, []int{2}, pollWhileProgressing},
		{"etcd awaited", kvv1.PhaseUpgrading, time.Minute, etcdAwaited, nil, pollWhileProgressing},
		{"a Ready cluster's rollout starts, a member pod awaited", kvv1.PhaseReady, time.Minute, podAwaited, nil, pollWhileAwaitingEvent},
		{"a Ready cluster's rollout starts, etcd awaited", kvv1.PhaseReady, time.Minute, etcdAwaited, nil, pollWhileProgressing},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kvc := kvcIn(tt.phase, tt.progressAgo)
			obs := Observation{ReadyMembers: 3, Cluster: etcdOf(3, "3.7.3", nil), ClaimsBeingDeleted: tt.claimsBeingDeleted}
			if v := phaseFuncs[tt.phase](kvc, obs, tt.ro, t0); v.phase != kvv1.PhaseUpgrading || v.requeueAfter != tt.want {
				t.Errorf("%s, looks again after %s; want Upgrading, after %s", v.phase, v.requeueAfter, tt.want)
			}
		})
	}
}

// A Ready cluster with members down is polled rarely while only its pods' changes (each of which
// wakes it) can bring it back, yet never later than its progress deadline; often while etcd may.
func TestReadyWithMembersDownLooksAgain(t *testing.T) {
	noQuorum := errors.New("no quorum")
	oneDown := etcdOf(3, "3.7.3", func(c *members.Cluster) { c.Members[1].Healthy = false })
	pods := func(p1 *Pod) map[int]Pod {
		out := map[int]Pod{0: {Ready: true, Running: true}, 2: {Ready: true, Running: true}}
		if p1 != nil {
			out[1] = *p1
		}
		return out
	}
	for _, tt := range []struct {
		name        string
		progressAgo time.Duration // of the 10-minute deadline
		obs         Observation
		want        time.Duration
	}{
		{"the down member's pod is gone", time.Hour, Observation{ReadyMembers: 2, Cluster: oneDown, Pods: pods(nil)}, pollWhileAwaitingEvent},
		{"the down member's pod is gone and its claim being deleted", time.Hour, Observation{ReadyMembers: 2, Cluster: oneDown, Pods: pods(nil), ClaimsBeingDeleted: []int{1}}, pollWhileProgressing},
		{"the down member's pod is stopping", time.Hour, Observation{ReadyMembers: 2, Cluster: oneDown, Pods: pods(&Pod{Running: true, Terminating: true})}, pollWhileAwaitingEvent},
		{"the down member's pod runs, not Ready", time.Hour, Observation{ReadyMembers: 2, Cluster: oneDown, Pods: pods(&Pod{Running: true})}, pollWhileAwaitingEvent},
		{"every member healthy, a pod not Ready", time.Hour, Observation{ReadyMembers: 2, Cluster: etcdOf(3, "3.7.3", nil), Pods: pods(&Pod{Running: true})}, pollWhileAwaitingEvent},
		{"the down member's pod is Ready: etcd shows when it is back", time.Hour, Observation{ReadyMembers: 3, Cluster: oneDown, Pods: pods(&Pod{Ready: true, Running: true})}, pollWhileProgressing},
		{"quorum lost, no member's etcd runs", time.Minute, Observation{EtcdErr: noQuorum, Pods: map[int]Pod{0: {}, 1: {}}}, pollWhileAwaitingEvent},
		{"quorum lost, no member's etcd runs, the deadline in 10s", 9*time.Minute + 50*time.Second, Observation{EtcdErr: noQuorum, Pods: map[int]Pod{0: {}, 1: {}}}, 11 * time.Second},
		{"quorum lost while a member's etcd runs", time.Minute, Observation{ReadyMembers: 1, EtcdErr: noQuorum, Pods: map[int]Pod{0: {Ready: true, Running: true}}}, pollWhileProgressing},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kvc := kvcIn(kvv1.PhaseReady, tt.progressAgo)
			if v := ready(kvc, tt.obs, Rollout{}, t0); v.phase != kvv1.PhaseReady || v.reason != ReasonMembersUnavailable || v.requeueAfter != tt.want {
				t.Errorf("%s (%s), looks again after %s; want Ready (%s), after %s", v.phase, v.reason, v.requeueAfter, ReasonMembersUnavailable, tt.want)
			}
		})
	}
}

// An idle reconcile must compute exactly the status it started from, or it would write every time.
func TestDecideIsStableWhenNothingChanges(t *testing.T) {
	for _, obs := range []Observation{
		{ReadyMembers: 3, Cluster: etcdOf(3, "3.7.3", nil)},
		{ReadyMembers: 1, EtcdErr: errors.New("no quorum")},
	} {
		kvc := kvcIn("", 0)
		first, _ := decide(kvc, obs, Rollout{}, t0)
		kvc.Status = first
		second, _ := decide(kvc, obs, Rollout{}, t0.Add(30*time.Second))
		if !equality.Semantic.DeepEqual(first, second) {
			t.Errorf("status changed without any change observed:\nfirst  %+v\nsecond %+v", first, second)
		}
	}
}

func TestConditionTransitionTimeMovesOnlyOnChange(t *testing.T) {
	kvc := kvcIn(kvv1.PhaseReady, time.Hour)
	st, _ := decide(kvc, Observation{ReadyMembers: 3, Cluster: etcdOf(3, "3.7.3", nil)}, Rollout{}, t0)
	kvc.Status = st
	st, _ = decide(kvc, Observation{ReadyMembers: 2, Cluster: etcdOf(3, "3.7.3", nil)}, Rollout{}, t0.Add(time.Minute))
	ready := meta.FindStatusCondition(st.Conditions, kvv1.ConditionReady)
	if ready.Status != metav1.ConditionFalse || !ready.LastTransitionTime.Time.Equal(t0.Add(time.Minute)) {
		t.Errorf("Ready went False at %v, want %v", ready.LastTransitionTime, t0.Add(time.Minute))
	}
	kvc.Status = st
	st, _ = decide(kvc, Observation{ReadyMembers: 1, Cluster: etcdOf(3, "3.7.3", nil)}, Rollout{}, t0.Add(2*time.Minute))
	if got := meta.FindStatusCondition(st.Conditions, kvv1.ConditionReady).LastTransitionTime; !got.Time.Equal(t0.Add(time.Minute)) {
		t.Errorf("Ready stayed False but its transition time moved to %v", got)
	}
}
