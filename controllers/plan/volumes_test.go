package plan

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// onVolumes gives a formed 3-member cluster storage.size and, per member, a bound claim of
// StorageClass "standard" asking for and holding the sizes given ("asked/has", or one size for
// both), made by a StatefulSet whose claim template asks for template ("": none yet) and gives
// members the default quota of that. The class allows expansion.
func onVolumes(size, template string, claims ...string) *scenario {
	s := formed(3, "3.7.3")
	s.kvc.Spec.Storage.Size = resource.MustParse(size)
	if template != "" {
		s.obs.STSClaimSize = resource.MustParse(template)
		s.obs.STSQuota = specs.QuotaBackendBytes(s.kvc, s.obs.STSClaimSize)
	}
	s.obs.Claims = map[int]Claim{}
	s.obs.ExpandableClasses = map[string]bool{"standard": true}
	for i, c := range claims {
		asked, has, _ := strings.Cut(c, "/")
		if has == "" {
			has = asked
		}
		name := fmt.Sprintf("data-kv-%d", i)
		s.obs.Claims[i] = Claim{Name: name, UID: types.UID("uid-" + name), Bound: true, Class: "standard",
			Requested: resource.MustParse(asked), Capacity: resource.MustParse(has)}
	}
	return s
}

// recorded sets status.volumeSize as an earlier reconcile wrote it.
func (s *scenario) recorded(size string) *scenario {
	q := resource.MustParse(size)
	s.kvc.Status.VolumeSize = &q
	return s
}

// TestASlowExpansionIsProgress: claims moving on towards storage.size count as progress, so a
// slow provisioner does not fail the cluster at the progress deadline; claims that stay where
// they were do fail it.
func TestASlowExpansionIsProgress(t *testing.T) {
	growing := func(kv0 string) *scenario {
		s := onVolumes("2Gi", "1Gi", kv0, "2Gi/1Gi", "2Gi/1Gi").recorded("1Gi")
		s.kvc.Status.Phase = kvv1.PhaseUpgrading
		s.kvc.Spec.ProgressDeadlineSeconds = 60
		started := metav1.NewTime(t0.Add(-time.Hour))
		s.kvc.Status.LastProgressTime = &started
		s.kvc.Status.Conditions = []metav1.Condition{{Type: kvv1.ConditionReconciling, Status: metav1.ConditionTrue, Reason: ReasonExpandingVolumes,
			Message: "expanding the members' volumes to 2Gi: data-kv-0 has 1Gi, data-kv-1 has 1Gi, data-kv-2 has 1Gi"}}
		return s
	}
	moved := Make(growing("2Gi/2Gi").kvc, growing("2Gi/2Gi").obs, t0, Config{})
	if moved.Status.Phase != kvv1.PhaseUpgrading || !moved.Status.LastProgressTime.Time.Equal(t0) {
		t.Errorf("a claim grew: phase %s, last progress %v; want Upgrading, now", moved.Status.Phase, moved.Status.LastProgressTime)
	}
	s := growing("2Gi/1Gi")
	if stuck := Make(s.kvc, s.obs, t0, Config{}); stuck.Status.Phase != kvv1.PhaseFailed {
		t.Errorf("no claim moved for an hour: phase %s, want Failed", stuck.Status.Phase)
	}
}

// TestVolumeGrowth: a grown storage.size expands each member's bound claim whose StorageClass
// allows it (Reconciling: ExpandingVolumes until every volume has the size); once all have it,
// status.volumeSize records it and the quota follows (members restart to take it). The claim
// template keeps the size it was made with; a StorageClass that cannot expand needs a person.
func TestVolumeGrowth(t *testing.T) {
	quota := func(size string) string { // the default's share of size, or "=<bytes>"
		if flag, ok := strings.CutPrefix(size, "="); ok {
			return "--quota-backend-bytes=" + flag + " "
		}
		return fmt.Sprintf("--quota-backend-bytes=%d ", specs.QuotaBackendBytes(&kvv1.KVCluster{}, resource.MustParse(size)))
	}
	tests := []struct {
		name       string
		s          *scenario
		wantExpand []string
		wantPhase  kvv1.Phase
		wantReason string // of the Reconciling condition, or of Stalled when Failed
		wantMsg    string
		wantSize   string // status.volumeSize ("" unset)
		wantQuota  string // the volume size the members' quota is the default's share of, or "=<bytes>"
		wantEvent  string
	}{
		{name: "as made: the size is recorded, nothing changes", s: onVolumes("1Gi", "1Gi", "1Gi", "1Gi", "1Gi"),
			wantPhase: kvv1.PhaseReady, wantReason: ReasonIdle, wantSize: "1Gi", wantQuota: "1Gi"},
		{name: "grown: every bound claim is expanded, the quota waits", s: onVolumes("2Gi", "1Gi", "1Gi", "1Gi", "1Gi").recorded("1Gi"),
			wantExpand: []string{"data-kv-0", "data-kv-1", "data-kv-2"}, wantPhase: kvv1.PhaseUpgrading, wantReason: ReasonExpandingVolumes,
			wantMsg: "expanding the members' volumes to 2Gi: data-kv-0 asks for 1Gi", wantSize: "1Gi", wantQuota: "1Gi"},
		{name: "asked for, the volumes are growing", s: onVolumes("2Gi", "1Gi", "2Gi/1Gi", "2Gi/2Gi", "2Gi/1Gi").recorded("1Gi"),
			wantPhase: kvv1.PhaseUpgrading, wantReason: ReasonExpandingVolumes, wantMsg: "data-kv-0 has 1Gi, data-kv-2 has 1Gi",
			wantSize: "1Gi", wantQuota: "1Gi"},
		{name: "every volume has it: recorded, the quota follows", s: onVolumes("2Gi", "1Gi", "2Gi", "2Gi", "2Gi").recorded("1Gi"),
			wantPhase: kvv1.PhaseUpgrading, wantReason: ReasonUpgrading, wantMsg: "restarting the members to take a backend quota of 748Mi",
			wantSize: "2Gi", wantQuota: "2Gi",
			wantEvent: EventVolumesExpanded + ": every member's volume has 2Gi now (was 1Gi): the backend quota goes from 313Mi to 748Mi"},
		{name: "every volume has it, the spec's quota stays", s: onVolumes("2Gi", "1Gi", "2Gi", "2Gi", "2Gi").recorded("1Gi").with(func(s *scenario) {
			q := resource.MustParse("100Mi")
			s.kvc.Spec.Space.BackendQuota, s.obs.STSQuota = &q, q.Value()
		}), wantPhase: kvv1.PhaseReady, wantReason: ReasonIdle, wantSize: "2Gi", wantQuota: fmt.Sprintf("=%d", 100<<20),
			wantEvent: EventVolumesExpanded + ": every member's volume has 2Gi now (was 1Gi)"},
		{name: "a quota raised with the size waits for the volumes", s: onVolumes("2Gi", "1Gi", "2Gi/1Gi", "2Gi/1Gi", "2Gi/1Gi").recorded("1Gi").with(func(s *scenario) {
			q := resource.MustParse("1400Mi")
			s.kvc.Spec.Space.BackendQuota, s.obs.STSQuota = &q, 600<<20
		}), wantPhase: kvv1.PhaseUpgrading, wantReason: ReasonExpandingVolumes, wantSize: "1Gi", wantQuota: fmt.Sprintf("=%d", 600<<20)},
		{name: "then takes it once they have grown", s: onVolumes("2Gi", "1Gi", "2Gi", "2Gi", "2Gi").recorded("1Gi").with(func(s *scenario) {
			q := resource.MustParse("1400Mi")
			s.kvc.Spec.Space.BackendQuota, s.obs.STSQuota = &q, 600<<20
		}), wantPhase: kvv1.PhaseUpgrading, wantReason: ReasonUpgrading, wantMsg: "restarting the members to take a backend quota of 1400Mi",
			wantSize: "2Gi", wantQuota: fmt.Sprintf("=%d", 1400<<20), wantEvent: "the backend quota goes from 600Mi to 1400Mi"},
		{name: "recorded before this release: the template's size, no restart", s: onVolumes("1Gi", "1Gi", "1Gi/1Gi", "1Gi/1Gi"),
			wantPhase: kvv1.PhaseReady, wantReason: ReasonIdle, wantQuota: "1Gi"}, // kv-2 has no claim: not recorded yet
		{name: "a member added after growing starts on the template: expanded, the quota stays", s: onVolumes("2Gi", "1Gi", "2Gi", "2Gi", "1Gi").recorded("2Gi"),
			wantExpand: []string{"data-kv-2"}, wantPhase: kvv1.PhaseUpgrading, wantReason: ReasonExpandingVolumes, wantSize: "2Gi", wantQuota: "2Gi"},
		{name: "a claim waits for its volume before it can be expanded", s: onVolumes("2Gi", "1Gi", "2Gi", "2Gi", "1Gi").recorded("2Gi").with(func(s *scenario) {
			c := s.obs.Claims[2]
			c.Bound, c.Capacity = false, resource.Quantity{}
			s.obs.Claims[2] = c
		}), wantPhase: kvv1.PhaseUpgrading, wantReason: ReasonExpandingVolumes, wantMsg: "data-kv-2 waits for its volume", wantSize: "2Gi", wantQuota: "2Gi"},
		{name: "the StorageClass cannot expand: a person must", s: onVolumes("2Gi", "1Gi", "1Gi", "1Gi", "1Gi").recorded("1Gi").with(func(s *scenario) {
			s.obs.ExpandableClasses["standard"] = false
		}), wantPhase: kvv1.PhaseFailed, wantReason: ReasonVolumeExpansionUnsupported,
			wantMsg: "claims data-kv-0, data-kv-1, data-kv-2 have StorageClass standard, which does not allow volume expansion", wantSize: "1Gi", wantQuota: "1Gi",
			wantEvent: ReasonVolumeExpansionUnsupported + ": storage.size is 2Gi"},
		{name: "the StorageClass is gone", s: onVolumes("2Gi", "1Gi", "1Gi", "1Gi", "1Gi").recorded("1Gi").with(func(s *scenario) {
			delete(s.obs.ExpandableClasses, "standard")
		}), wantPhase: kvv1.PhaseFailed, wantReason: ReasonVolumeExpansionUnsupported,
			wantMsg: "claims data-kv-0, data-kv-1, data-kv-2 have StorageClass standard, which does not exist", wantSize: "1Gi", wantQuota: "1Gi"},
		{name: "adopted claims smaller than storage.size: expanded, the quota theirs meanwhile", s: onVolumes("2Gi", "", "1Gi", "1Gi", "1Gi").with(func(s *scenario) {
			s.kvc.Status = kvv1.KVClusterStatus{}
			s.obs.Cluster, s.obs.ReadyMembers = nil, 0
		}), wantExpand: []string{"data-kv-0", "data-kv-1", "data-kv-2"}, wantPhase: kvv1.PhaseCreating, wantReason: ReasonCreating, wantQuota: "1Gi"},
		{name: "a new cluster's claims waiting for volumes are no growth", s: onVolumes("1Gi", "", "1Gi", "1Gi", "1Gi").with(func(s *scenario) {
			s.kvc.Status = kvv1.KVClusterStatus{}
			s.obs.Cluster, s.obs.ReadyMembers = nil, 0
			for i, c := range s.obs.Claims {
				c.Bound, c.Capacity = false, resource.Quantity{}
				s.obs.Claims[i] = c
			}
		}), wantPhase: kvv1.PhaseCreating, wantReason: ReasonCreating, wantQuota: "1Gi"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Make(tt.s.kvc, tt.s.obs, t0, Config{})
			var expanded []string
			for _, e := range p.ExpandClaims {
				expanded = append(expanded, e.Name)
				if e.Size.String() != tt.s.kvc.Spec.Storage.Size.String() || e.UID != types.UID("uid-"+e.Name) {
					t.Errorf("expansion %+v: want the spec's size and the claim's UID", e)
				}
			}
			if !slices.Equal(expanded, tt.wantExpand) {
				t.Errorf("expanded claims %v, want %v", expanded, tt.wantExpand)
			}
			if p.Status.Phase != tt.wantPhase {
				t.Errorf("phase %s, want %s (%s)", p.Status.Phase, tt.wantPhase, p.Message)
			}
			condition := kvv1.ConditionReconciling
			if tt.wantPhase == kvv1.PhaseFailed {
				condition = kvv1.ConditionStalled
			}
			if c := meta.FindStatusCondition(p.Status.Conditions, condition); c == nil || c.Reason != tt.wantReason || !strings.Contains(c.Message, tt.wantMsg) {
				t.Errorf("%s condition %+v, want reason %s with %q", condition, c, tt.wantReason, tt.wantMsg)
			}
			if got := p.Status.VolumeSize; (got == nil) != (tt.wantSize == "") || got != nil && got.String() != tt.wantSize {
				t.Errorf("status.volumeSize %v, want %q", got, tt.wantSize)
			}
			if p.Children == nil {
				t.Fatal("no children planned")
			}
			set := p.Children.Set
			if set.ClaimSize.String() != tt.s.obs.STSClaimSize.String() {
				t.Errorf("claim template size %s, want the StatefulSet's %s", set.ClaimSize.String(), tt.s.obs.STSClaimSize.String())
			}
			if args := strings.Join(specs.StatefulSet(tt.s.kvc, set).Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, quota(tt.wantQuota)) {
				t.Errorf("members' quota: want a share of %s (%s): %s", tt.wantQuota, quota(tt.wantQuota), args)
			}
			var events []string
			for _, e := range p.Events {
				events = append(events, e.Reason+": "+e.Message)
			}
			if got := strings.Join(events, "\n"); tt.wantEvent != "" && !strings.Contains(got, tt.wantEvent) || tt.wantEvent == "" && strings.Contains(got, EventVolumesExpanded) {
				t.Errorf("events:\n%s\nwant one with %q", got, tt.wantEvent)
			}
		})
	}
}

// TestAFileSystemGrownOnlyOnMountRestartsItsMember: a driver that grows a file system only when a
// pod mounts the volume leaves the claim FileSystemResizePending; the member is restarted through
// the rollout (one at a time, quorum kept), and not again once its pod was made after the claim
// began to wait.
func TestAFileSystemGrownOnlyOnMountRestartsItsMember(t *testing.T) {
	waiting := func(podCreated time.Time) *scenario {
		s := onVolumes("2Gi", "1Gi", "2Gi/2Gi", "2Gi/2Gi", "2Gi/1Gi").recorded("1Gi")
		c := s.obs.Claims[2]
		c.ResizePendingSince = t0.Add(-time.Minute)
		s.obs.Claims[2] = c
		for ord, p := range s.obs.Pods {
			p.Created = t0.Add(-time.Hour)
			if ord == 2 {
				p.Created = podCreated
			}
			s.obs.Pods[ord] = p
		}
		return s
	}
	s := waiting(t0.Add(-time.Hour))
	p := Make(s.kvc, s.obs, t0, Config{})
	if p.Rollout.Action != ActRestartPod || p.Rollout.Ordinal != 2 || p.Status.Phase != kvv1.PhaseUpgrading {
		t.Errorf("a member whose claim waits for a mount: action %d on %d, phase %s (%s); want kv-2 restarted", p.Rollout.Action, p.Rollout.Ordinal, p.Status.Phase, p.Message)
	}
	if s.obs.Pods[2].Outdated {
		t.Error("the observation was changed: the pods must stay as observed")
	}
	s = waiting(t0.Add(-time.Second))
	p = Make(s.kvc, s.obs, t0, Config{})
	if p.Rollout.Action != ActWait || !strings.Contains(p.Message, "data-kv-2 has 1Gi, its file system grows when its member restarts") {
		t.Errorf("restarted since the claim began to wait: action %d (%s); want no second restart", p.Rollout.Action, p.Message)
	}
}

// TestAQuotaTooLargeForTheWALIsLoweredOnceTheDatabasesFit: members running a quota that leaves
// the WAL too little room (an earlier release's default of 60% of the volume, or a spec quota it
// admitted) move to today's only once every member answers with a database of at most half of
// it, so they restart once and the lower quota brings no database near it; until then they keep
// theirs. A spec quota the volume holds is the spec's.
func TestAQuotaTooLargeForTheWALIsLoweredOnceTheDatabasesFit(t *testing.T) {
	earlier := int64(1<<30) * 6 / 10 // 614Mi
	today := specs.QuotaBackendBytes(&kvv1.KVCluster{}, resource.MustParse("1Gi"))
	running := func(quota int64, dbs ...int64) func(*scenario) {
		return func(s *scenario) {
			s.obs.STSQuota = quota
			for i := range s.obs.Cluster.Members {
				s.obs.Cluster.Members[i].DBSize = 0
				if i < len(dbs) {
					s.obs.Cluster.Members[i].DBSize = dbs[i]
				}
			}
		}
	}
	specQuota := func(size string) func(*scenario) {
		return func(s *scenario) {
			q := resource.MustParse(size)
			s.kvc.Spec.Space.BackendQuota = &q
		}
	}
	tests := []struct {
		name      string
		with      []func(*scenario)
		wantQuota int64
	}{
		{name: "small databases: today's default", with: []func(*scenario){running(earlier, 20<<20, 21<<20, today/2)}, wantQuota: today},
		{name: "a database past half of it: kept", with: []func(*scenario){running(earlier, 20<<20, today/2+1, 20<<20)}, wantQuota: earlier},
		{name: "a member that does not answer: kept", with: []func(*scenario){running(earlier, 20<<20, 20<<20, 20<<20), func(s *scenario) {
			s.obs.Cluster.Members[1].Healthy = false
		}}, wantQuota: earlier},
		{name: "a member's size unknown: kept", with: []func(*scenario){running(earlier, 20<<20, 21<<20)}, wantQuota: earlier},
		{name: "etcd does not answer: kept", with: []func(*scenario){running(earlier), func(s *scenario) { s.obs.Cluster = nil }}, wantQuota: earlier},
		{name: "a spec quota admitted earlier, past what the volume holds, databases large: kept", with: []func(*scenario){
			running(800<<20, 20<<20, 400<<20, 20<<20), specQuota("800Mi")}, wantQuota: 800 << 20},
		{name: "a spec quota admitted earlier, databases small: what the volume holds", with: []func(*scenario){
			running(800<<20, 20<<20, 20<<20, 20<<20), specQuota("800Mi")}, wantQuota: specs.MaxQuotaBytes(resource.MustParse("1Gi"))},
		{name: "a spec quota lowered by a person is theirs", with: []func(*scenario){running(earlier, 20<<20, 400<<20, 20<<20), specQuota("100Mi")}, wantQuota: 100 << 20},
		{name: "a default that grows is taken", with: []func(*scenario){running(100 << 20)}, wantQuota: today},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := onVolumes("1Gi", "1Gi", "1Gi", "1Gi", "1Gi").recorded("1Gi")
			for _, f := range tt.with {
				s.with(f)
			}
			p := Make(s.kvc, s.obs, t0, Config{})
			if p.Children == nil || p.Children.Set.Quota != tt.wantQuota {
				got := int64(-1)
				if p.Children != nil {
					got = p.Children.Set.Quota
				}
				t.Errorf("members' quota %d, want %d", got, tt.wantQuota)
			}
		})
	}
}
