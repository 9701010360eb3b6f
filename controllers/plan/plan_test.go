package plan

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

func TestFinalizerChange(t *testing.T) {
	withBackup := backedUp("")
	tests := []struct {
		name                 string
		kvc                  *kvv1.KVCluster
		finalizers           []string
		wantWant, wantChange bool
	}{
		{name: "a backup destination adds it", kvc: withBackup, wantWant: true, wantChange: true},
		{name: "held already", kvc: withBackup, finalizers: []string{kvv1.FinalizerFinalBackup}, wantWant: true},
		{name: "nothing to do on deletion: none", kvc: kvcIn(kvv1.PhaseReady, 0)},
		{name: "the last step removed from the spec gives it up", kvc: kvcIn(kvv1.PhaseReady, 0), finalizers: []string{kvv1.FinalizerFinalBackup}, wantChange: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kvc := tt.kvc.DeepCopy()
			kvc.Finalizers = tt.finalizers
			if want, change := FinalizerChange(kvc); want != tt.wantWant || change != tt.wantChange {
				t.Errorf("FinalizerChange = %t, %t; want %t, %t", want, change, tt.wantWant, tt.wantChange)
			}
		})
	}
}

// TestMake: what one reconcile of a live cluster writes and does, decided in one place.
func TestMake(t *testing.T) {
	cfg := Config{Images: specs.Images{EtcdRepository: "etcd", Operator: "operator:dev"}}
	ready := func(change func(s *scenario)) *scenario { return formed(3, "3.7.3").with(change) }
	strangerAlarm := members.Alarm{MemberID: 0x99, Type: "NOSPACE"}
	ownAlarm := members.Alarm{MemberID: 1, Type: "NOSPACE"}
	tests := []struct {
		name        string
		s           *scenario
		wantPhase   kvv1.Phase
		wantReason  string
		wantObjects bool
		wantAdopt   string
		wantAction  Action
		wantDisarm  []members.Alarm
		wantRequeue time.Duration
		wantEvents  string
		// wantLookOnly: the requeue only looks again, behind every cluster a watch event woke.
		wantLookOnly bool
	}{
		{name: "a healthy cluster: its objects, nothing to do, looked at in a minute", s: formed(3, "3.7.3"),
			wantPhase: kvv1.PhaseReady, wantReason: ReasonClusterReady, wantObjects: true, wantRequeue: time.Minute, wantLookOnly: true},
		{name: "a new version: Upgrading, and the first step is taken at once", s: ready(func(s *scenario) { s.upgradeTo("3.7.4") }),
			wantPhase: kvv1.PhaseUpgrading, wantReason: ReasonUpgrading, wantObjects: true, wantAction: ActRestartPod, wantRequeue: 5 * time.Second,
			wantEvents: ReasonUpgrading},
		{name: "an unknown member: Ready=False, one warning, nothing acted on", s: ready(func(s *scenario) {
			s.obs.Cluster.Members = append(s.obs.Cluster.Members, members.Member{ID: 0x4d, Name: "intruder", Healthy: true})
		}), wantPhase: kvv1.PhaseReady, wantReason: ReasonUnknownMember, wantObjects: true, wantRequeue: 5 * time.Second, wantEvents: ReasonUnknownMember, wantLookOnly: true},
		{name: "leftover volumes: nothing written but status", s: ready(func(s *scenario) { s.obs.LeftoverClaims = []string{"data-kv-0"} }),
			wantPhase: kvv1.PhaseFailed, wantReason: ReasonLeftoverVolumes, wantRequeue: 30 * time.Second, wantEvents: ReasonLeftoverVolumes, wantLookOnly: true},
		{name: "leftover volumes the user adopts: adopted, and no conflict", s: ready(func(s *scenario) {
			s.obs.LeftoverClaims = []string{"data-kv-0"}
			s.kvc.Annotations = map[string]string{kvv1.AnnotationAdoptVolumes: "true"}
		}), wantPhase: kvv1.PhaseReady, wantReason: ReasonClusterReady, wantObjects: true, wantAdopt: "data-kv-0", wantRequeue: time.Minute, wantLookOnly: true},
		{name: "never adopted for a restore, which would be skipped on them", s: ready(func(s *scenario) {
			s.obs.LeftoverClaims = []string{"data-kv-0"}
			s.kvc.Annotations = map[string]string{kvv1.AnnotationAdoptVolumes: "true"}
			s.kvc.Spec.Restore = &kvv1.RestoreSpec{Key: "ns/kv/old.db"}
		}), wantPhase: kvv1.PhaseFailed, wantReason: ReasonLeftoverVolumes, wantRequeue: 30 * time.Second, wantEvents: ReasonLeftoverVolumes, wantLookOnly: true},
		// Its own member's NOSPACE alarm is real: writes are refused, and SpacePressure says so.
		{name: "an alarm of a member the cluster does not have is disarmed", s: ready(func(s *scenario) {
			s.obs.Cluster.Alarms = []members.Alarm{strangerAlarm, ownAlarm}
		}), wantPhase: kvv1.PhaseReady, wantReason: ReasonWritesRefused, wantObjects: true, wantDisarm: []members.Alarm{strangerAlarm},
			wantRequeue: 5 * time.Second, wantEvents: ReasonNoSpace},
		{name: "a restored cluster forming disarms every alarm its snapshot carried", s: ready(func(s *scenario) {
			s.kvc.Status.Phase, s.kvc.Status.CurrentVersion = kvv1.PhaseCreating, ""
			s.kvc.Spec.Restore = &kvv1.RestoreSpec{Key: "ns/kv/old.db"}
			s.obs.Cluster.Alarms = []members.Alarm{ownAlarm}
		}), wantPhase: kvv1.PhaseCreating, wantReason: ReasonCreating, wantObjects: true, wantDisarm: []members.Alarm{ownAlarm},
			wantRequeue: 5 * time.Second},
		{name: "the next backup slot comes before the next poll", s: ready(func(s *scenario) {
			s.kvc.Spec.Backup = backedUp("* * * * *").Spec.Backup
			s.kvc.Spec.BackupSchedule = "* * * * *"
			at := t0.Add(-30 * time.Second)
			s.kvc.Status.LastScheduledTime = metaTime(at.Truncate(time.Minute))
		}), wantPhase: kvv1.PhaseReady, wantReason: ReasonClusterReady, wantObjects: true, wantRequeue: time.Minute - 10*time.Second},
		{name: "etcd does not answer: looked at again, behind every cluster with news", s: ready(func(s *scenario) {
			s.obs.Cluster, s.obs.EtcdErr = nil, members.ErrNoQuorum
		}), wantPhase: kvv1.PhaseReady, wantReason: ReasonMembersUnavailable, wantObjects: true, wantRequeue: 5 * time.Second, wantLookOnly: true},
		{name: "a member down, the others answering: its pod's readiness is the news", s: ready(func(s *scenario) { s.member(1).Healthy = false }),
			wantPhase: kvv1.PhaseReady, wantReason: ReasonMembersUnavailable, wantObjects: true, wantRequeue: 5 * time.Second, wantLookOnly: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Make(tt.s.kvc, tt.s.obs, t0.Add(10*time.Second), cfg)
			var events, adopted []string
			for _, e := range p.Events {
				events = append(events, e.Reason)
			}
			for _, c := range p.AdoptClaims {
				adopted = append(adopted, c.Name)
			}
			if p.Status.Phase != tt.wantPhase || p.Reason != tt.wantReason || (p.Children != nil) != tt.wantObjects ||
				strings.Join(adopted, ",") != tt.wantAdopt || p.Rollout.Action != tt.wantAction ||
				len(p.Disarm) != len(tt.wantDisarm) || p.RequeueAfter != tt.wantRequeue || strings.Join(events, " ") != tt.wantEvents ||
				p.OnlyLooksAgain != tt.wantLookOnly {
				t.Fatalf("phase %s/%s, objects %t, adopt %v, action %d, disarm %v, requeue %v (only looking again %t), events %v (%s);\nwant %s/%s, %t, %q, %d, %v, %v (%t), %q",
					p.Status.Phase, p.Reason, p.Children != nil, p.AdoptClaims, p.Rollout.Action, p.Disarm, p.RequeueAfter, p.OnlyLooksAgain, events, p.Message,
					tt.wantPhase, tt.wantReason, tt.wantObjects, tt.wantAdopt, tt.wantAction, tt.wantDisarm, tt.wantRequeue, tt.wantLookOnly, tt.wantEvents)
			}
			for i := range p.Disarm {
				if p.Disarm[i] != tt.wantDisarm[i] {
					t.Errorf("disarms %v, want %v", p.Disarm, tt.wantDisarm)
				}
			}
			if p.Children != nil && (p.Children.Set.Replicas != 3 || p.Children.Set.Images != cfg.Images || p.Children.DisruptionBase != 3) {
				t.Errorf("objects from %+v, want 3 members of the configured images", *p.Children)
			}
			if p.Rollout.Action == ActRestartPod && p.Rollout.PodUID != types.UID("pod-kv-2") {
				t.Errorf("restarts pod %q, want kv-2's", p.Rollout.PodUID)
			}
		})
	}
}

// TestANewClusterWithoutSecureDefaultsIsWarnedAbout: a new cluster created without spec.tls or
// spec.networkPolicy (the secure-by-default policies missing, or not in effect yet) gets one
// Warning for each; one that states them, or has run before, gets none.
func TestANewClusterWithoutSecureDefaultsIsWarnedAbout(t *testing.T) {
	stated := kvcIn("", 0)
	stated.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSDisabled}
	stated.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{Mode: kvv1.NetworkPolicyDisabled}
	tlsOnly := kvcIn("", 0)
	tlsOnly.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	for name, tt := range map[string]struct {
		kvc  *kvv1.KVCluster
		want []string
	}{
		"new, both unset":           {kvcIn("", 0), []string{EventTLSUnset, EventNetworkPolicyUnset}},
		"new, network policy unset": {tlsOnly, []string{EventNetworkPolicyUnset}},
		"new, both stated":          {stated, nil},
		"running, both unset":       {kvcIn(kvv1.PhaseReady, 0), nil},
	} {
		t.Run(name, func(t *testing.T) {
			var warned []string
			for _, e := range Make(tt.kvc, Observation{}, t0, Config{}).Events {
				if e.Type == "Warning" && (e.Reason == EventTLSUnset || e.Reason == EventNetworkPolicyUnset) {
					warned = append(warned, e.Reason)
				}
			}
			if !slices.Equal(warned, tt.want) {
				t.Errorf("warned %v, want %v", warned, tt.want)
			}
		})
	}
}

func metaTime(t time.Time) *metav1.Time {
	m := metav1.NewTime(t)
	return &m
}
