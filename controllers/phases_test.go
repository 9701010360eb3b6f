package controllers

import (
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// healthyCluster is etcd's answer for n voting members on one version, member 0 leading.
func healthyCluster(n int, version string) *members.Cluster {
	c := &members.Cluster{HasLeader: true}
	for i := range n {
		c.Members = append(c.Members, members.Member{ID: uint64(i + 1), Name: "kv-" + string(rune('0'+i)),
			Healthy: true, Leader: i == 0, Version: version})
	}
	return c
}

func kvcIn(phase kvv1.Phase, progressAgo time.Duration) *kvv1.KVCluster {
	kvc := &kvv1.KVCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "kv", Namespace: "ns", Generation: 1, CreationTimestamp: metav1.NewTime(t0.Add(-time.Hour))},
		Spec:       kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 3, ProgressDeadlineSeconds: 600},
	}
	if phase != "" {
		p := metav1.NewTime(t0.Add(-progressAgo))
		kvc.Status = kvv1.KVClusterStatus{Phase: phase, ObservedGeneration: 1, LastProgressTime: &p}
	}
	return kvc
}

func TestDecidePhaseTransitions(t *testing.T) {
	noQuorum := errors.New("no quorum")
	mixed := healthyCluster(3, "3.7.3")
	mixed.Members[2].Version = "3.6.16"
	withLearner := healthyCluster(3, "3.7.3")
	withLearner.Members[2].Learner = true
	oneDown := healthyCluster(3, "3.7.3")
	oneDown.Members[1].Healthy = false
	rolling := rollout{pending: true, action: actWait, reason: ReasonUpgrading, message: "1/3 members on 3.7.4; waiting for member kv-1 to be healthy"}

	tests := []struct {
		name        string
		kvc         *kvv1.KVCluster
		obs         observation
		wantPhase   kvv1.Phase
		wantReason  string
		wantReady   bool
		wantStalled bool
		wantRecon   bool
		wantVersion string
	}{
		{"new cluster starts Creating", kvcIn("", 0), observation{etcdErr: errors.New("no member pods exist yet")},
			kvv1.PhaseCreating, ReasonCreating, false, false, true, ""},
		{"creating: all members ready and etcd healthy -> Ready", kvcIn(kvv1.PhaseCreating, time.Minute),
			observation{readyMembers: 3, cluster: healthyCluster(3, "3.7.3")},
			kvv1.PhaseReady, ReasonClusterReady, true, false, false, "3.7.3"},
		{"creating: pods ready but etcd not answering stays Creating", kvcIn(kvv1.PhaseCreating, time.Minute),
			observation{readyMembers: 3, etcdErr: noQuorum}, kvv1.PhaseCreating, ReasonCreating, false, false, true, ""},
		{"creating: pods ready but one member not answering", kvcIn(kvv1.PhaseCreating, time.Minute),
			observation{readyMembers: 3, cluster: oneDown}, kvv1.PhaseCreating, ReasonCreating, false, false, true, ""},
		{"creating: a learner is not a voting member", kvcIn(kvv1.PhaseCreating, time.Minute),
			observation{readyMembers: 3, cluster: withLearner}, kvv1.PhaseCreating, ReasonCreating, false, false, true, "3.7.3"},
		{"creating: too few members in etcd", kvcIn(kvv1.PhaseCreating, time.Minute),
			observation{readyMembers: 3, cluster: healthyCluster(2, "3.7.3")}, kvv1.PhaseCreating, ReasonCreating, false, false, true, "3.7.3"},
		{"creating: no progress past the deadline -> Failed", kvcIn(kvv1.PhaseCreating, 11*time.Minute),
			observation{readyMembers: 1, etcdErr: noQuorum}, kvv1.PhaseFailed, ReasonProgressDeadline, false, true, false, ""},
		{"ready stays Ready when healthy", kvcIn(kvv1.PhaseReady, time.Hour),
			observation{readyMembers: 3, cluster: healthyCluster(3, "3.7.3")}, kvv1.PhaseReady, ReasonClusterReady, true, false, false, "3.7.3"},
		{"ready: a member down keeps quorum -> Ready phase, Ready=False", kvcIn(kvv1.PhaseReady, time.Hour),
			observation{readyMembers: 2, cluster: oneDown}, kvv1.PhaseReady, ReasonMembersUnavailable, false, false, false, ""},
		{"ready: quorum lost within the deadline waits", kvcIn(kvv1.PhaseReady, time.Minute),
			observation{readyMembers: 1, etcdErr: noQuorum}, kvv1.PhaseReady, ReasonMembersUnavailable, false, false, false, ""},
		{"ready: quorum lost past the deadline -> Failed", kvcIn(kvv1.PhaseReady, 11*time.Minute),
			observation{readyMembers: 1, etcdErr: noQuorum}, kvv1.PhaseFailed, ReasonQuorumLost, false, true, false, ""},
		{"ready: members on different versions keep the old currentVersion", kvcIn(kvv1.PhaseReady, time.Hour),
			observation{readyMembers: 3, cluster: mixed}, kvv1.PhaseReady, ReasonClusterReady, true, false, false, ""},
		{"failed: healing by itself -> Ready", kvcIn(kvv1.PhaseFailed, time.Hour),
			observation{readyMembers: 3, cluster: healthyCluster(3, "3.7.3")}, kvv1.PhaseReady, ReasonClusterReady, true, false, false, "3.7.3"},
		{"ready: a pending rollout -> Upgrading", kvcIn(kvv1.PhaseReady, time.Hour),
			observation{readyMembers: 3, cluster: healthyCluster(3, "3.7.3"), rollout: rolling}, kvv1.PhaseUpgrading, ReasonUpgrading, false, false, true, "3.7.3"},
		{"ready: no quorum and unknown work stays Ready", kvcIn(kvv1.PhaseReady, time.Minute),
			observation{readyMembers: 1, etcdErr: noQuorum, rollout: rollout{pending: true, reason: ReasonMembershipUnknown}}, kvv1.PhaseReady, ReasonMembersUnavailable, false, false, false, ""},
		{"upgrading: making progress", kvcIn(kvv1.PhaseUpgrading, time.Minute),
			observation{readyMembers: 2, cluster: oneDown, rollout: rolling}, kvv1.PhaseUpgrading, ReasonUpgrading, false, false, true, ""},
		{"upgrading: nothing left -> Ready", kvcIn(kvv1.PhaseUpgrading, time.Minute),
			observation{readyMembers: 3, cluster: healthyCluster(3, "3.7.4")}, kvv1.PhaseReady, ReasonClusterReady, true, false, false, "3.7.4"},
		{"upgrading: no progress past the deadline -> Failed", kvcIn(kvv1.PhaseUpgrading, 11*time.Minute),
			observation{readyMembers: 2, cluster: oneDown, rollout: rolling}, kvv1.PhaseFailed, ReasonRolloutStalled, false, true, false, ""},
		{"upgrading: quorum lost past the deadline -> Failed", kvcIn(kvv1.PhaseUpgrading, 11*time.Minute),
			observation{readyMembers: 1, etcdErr: noQuorum, rollout: rolling}, kvv1.PhaseFailed, ReasonQuorumLost, false, true, false, ""},
		{"failed: a spec change on a formed cluster -> Upgrading", func() *kvv1.KVCluster {
			k := kvcIn(kvv1.PhaseFailed, time.Hour)
			k.Generation, k.Status.CurrentVersion = 2, "3.6.16"
			return k
		}(), observation{readyMembers: 2, cluster: oneDown, rollout: rolling}, kvv1.PhaseUpgrading, ReasonSpecChanged, false, false, true, "3.6.16"},
		{"failed: stays Failed while nothing changes", kvcIn(kvv1.PhaseFailed, time.Hour),
			observation{readyMembers: 0, etcdErr: noQuorum}, kvv1.PhaseFailed, ReasonProgressDeadline, false, true, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, v := decide(tt.kvc, tt.obs, "http://kv-client.ns.svc:2379", t0)
			if st.Phase != tt.wantPhase || v.reason != tt.wantReason {
				t.Fatalf("phase/reason = %s/%s, want %s/%s (%s)", st.Phase, v.reason, tt.wantPhase, tt.wantReason, v.message)
			}
			for cond, want := range map[string]bool{kvv1.ConditionReady: tt.wantReady, kvv1.ConditionStalled: tt.wantStalled, kvv1.ConditionReconciling: tt.wantRecon} {
				if got := meta.IsStatusConditionTrue(st.Conditions, cond); got != want {
					t.Errorf("condition %s = %v, want %v", cond, got, want)
				}
			}
			if st.CurrentVersion != tt.wantVersion {
				t.Errorf("currentVersion = %q, want %q", st.CurrentVersion, tt.wantVersion)
			}
			if st.ObservedGeneration != tt.kvc.Generation || st.ReadyPartitions != tt.obs.readyMembers {
				t.Errorf("observedGeneration/readyPartitions = %d/%d", st.ObservedGeneration, st.ReadyPartitions)
			}
		})
	}
}

func TestDecideFailedLeavesOnSpecChange(t *testing.T) {
	kvc := kvcIn(kvv1.PhaseCreating, 11*time.Minute)
	st, _ := decide(kvc, observation{etcdErr: errors.New("down")}, "", t0)
	if st.Phase != kvv1.PhaseFailed {
		t.Fatalf("phase = %s, want Failed", st.Phase)
	}
	stalled := meta.FindStatusCondition(st.Conditions, kvv1.ConditionStalled)

	kvc.Status = st
	st2, v := decide(kvc, observation{etcdErr: errors.New("still down")}, "", t0.Add(time.Minute))
	if st2.Phase != kvv1.PhaseFailed || v.message != stalled.Message {
		t.Errorf("an unchanged spec must keep Failed with its first explanation, got %s %q", st2.Phase, v.message)
	}

	kvc.Generation = 2 // a person edited the spec
	st3, v := decide(kvc, observation{etcdErr: errors.New("still down")}, "", t0.Add(2*time.Minute))
	if st3.Phase != kvv1.PhaseCreating || v.reason != ReasonSpecChanged {
		t.Fatalf("after a spec change phase = %s (%s), want Creating", st3.Phase, v.reason)
	}
	if !st3.LastProgressTime.Time.Equal(t0.Add(2 * time.Minute)) {
		t.Errorf("a new attempt must restart the progress deadline, lastProgressTime = %v", st3.LastProgressTime)
	}
}

// An idle reconcile must compute exactly the status it started from, or it would write every time.
func TestDecideIsStableWhenNothingChanges(t *testing.T) {
	for _, obs := range []observation{
		{readyMembers: 3, cluster: healthyCluster(3, "3.7.3")},
		{readyMembers: 1, etcdErr: errors.New("no quorum")},
	} {
		kvc := kvcIn("", 0)
		first, _ := decide(kvc, obs, "e", t0)
		kvc.Status = first
		second, _ := decide(kvc, obs, "e", t0.Add(30*time.Second))
		if !equality.Semantic.DeepEqual(first, second) {
			t.Errorf("status changed without any change observed:\nfirst  %+v\nsecond %+v", first, second)
		}
	}
}

func TestConditionTransitionTimeMovesOnlyOnChange(t *testing.T) {
	kvc := kvcIn(kvv1.PhaseReady, time.Hour)
	st, _ := decide(kvc, observation{readyMembers: 3, cluster: healthyCluster(3, "3.7.3")}, "", t0)
	kvc.Status = st
	st, _ = decide(kvc, observation{readyMembers: 2, cluster: healthyCluster(3, "3.7.3")}, "", t0.Add(time.Minute))
	ready := meta.FindStatusCondition(st.Conditions, kvv1.ConditionReady)
	if ready.Status != metav1.ConditionFalse || !ready.LastTransitionTime.Time.Equal(t0.Add(time.Minute)) {
		t.Errorf("Ready went False at %v, want %v", ready.LastTransitionTime, t0.Add(time.Minute))
	}
	kvc.Status = st
	st, _ = decide(kvc, observation{readyMembers: 1, cluster: healthyCluster(3, "3.7.3")}, "", t0.Add(2*time.Minute))
	if got := meta.FindStatusCondition(st.Conditions, kvv1.ConditionReady).LastTransitionTime; !got.Time.Equal(t0.Add(time.Minute)) {
		t.Errorf("Ready stayed False but its transition time moved to %v", got)
	}
}
