package plan

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
)

const mib = 1 << 20

// sized gives every member of a formed 3-member cluster a 100 MiB quota and the database sizes
// given (MiB; in use: half of it).
func sized(sizes ...int64) *scenario {
	s := formed(3, "3.7.3")
	for i, size := range sizes {
		m := s.member(i)
		m.DBSize, m.DBSizeInUse, m.DBSizeQuota = size*mib, size*mib/2, 100*mib
	}
	return s
}

// withSpaceCondition records a previous SpacePressure condition, as the last status wrote it.
func (s *scenario) withSpaceCondition(status metav1.ConditionStatus, reason string) *scenario {
	s.kvc.Status.Conditions = append(s.kvc.Status.Conditions, metav1.Condition{Type: kvv1.ConditionSpacePressure, Status: status, Reason: reason})
	return s
}

// TestSpacePressure: the SpacePressure condition is True while a NOSPACE alarm makes the cluster
// refuse writes (the Ready condition then says WritesRefused) or a database passed 80% of the
// quota; a change is announced once (a Warning, or SpaceRecovered when it clears); an alarm the
// cluster inherited from a snapshot, and a moment without etcd's answer, change nothing.
func TestSpacePressure(t *testing.T) {
	ownAlarm := members.Alarm{MemberID: 2, Type: "NOSPACE"}
	stranger := members.Alarm{MemberID: 0x99, Type: "NOSPACE"}
	tests := []struct {
		name        string
		s           *scenario
		want        metav1.ConditionStatus // "" = no condition
		wantReason  string
		wantMessage string
		wantEvent   string
		wantReady   string
	}{
		{name: "room", s: sized(10, 20, 79), want: metav1.ConditionFalse, wantReason: ReasonSpaceAvailable, wantReady: ReasonClusterReady},
		{name: "a database at 80% of the quota", s: sized(10, 80, 20), want: metav1.ConditionTrue, wantReason: ReasonNearQuota,
			wantMessage: "kv-1 80Mi of 100Mi", wantEvent: ReasonNearQuota, wantReady: ReasonClusterReady},
		{name: "still near the quota: no second event", s: sized(10, 85, 20).withSpaceCondition(metav1.ConditionTrue, ReasonNearQuota),
			want: metav1.ConditionTrue, wantReason: ReasonNearQuota, wantReady: ReasonClusterReady},
		{name: "a NOSPACE alarm: writes refused", s: func() *scenario {
			s := sized(10, 100, 20).withSpaceCondition(metav1.ConditionTrue, ReasonNearQuota)
			s.obs.Cluster.Alarms = []members.Alarm{ownAlarm}
			return s
		}(), want: metav1.ConditionTrue, wantReason: ReasonNoSpace, wantMessage: "NOSPACE alarm (kv-1)", wantEvent: ReasonNoSpace, wantReady: ReasonWritesRefused},
		{name: "compacted and defragmented", s: sized(10, 30, 20).withSpaceCondition(metav1.ConditionTrue, ReasonNoSpace),
			want: metav1.ConditionFalse, wantReason: ReasonSpaceAvailable, wantEvent: EventSpaceRecovered, wantReady: ReasonClusterReady},
		{name: "an inherited alarm is no space problem", s: func() *scenario {
			s := sized(10, 10, 10)
			s.obs.Cluster.Alarms = []members.Alarm{stranger}
			return s
		}(), want: metav1.ConditionFalse, wantReason: ReasonSpaceAvailable, wantReady: ReasonWritesRefused},
		{name: "the member near the quota restarts: left as it was", s: func() *scenario {
			s := sized(10, 85, 20)
			s.kvc.Status = Make(s.kvc, s.obs, t0, Config{}).Status // it was seen near the quota
			s.member(1).Healthy, s.member(1).DBSize, s.member(1).DBSizeQuota = false, 0, 0
			return s
		}(), want: metav1.ConditionTrue, wantReason: ReasonNearQuota, wantMessage: "kv-1 85Mi of 100Mi", wantReady: ReasonMembersUnavailable},
		{name: "etcd does not answer: left as it was", s: func() *scenario {
			s := sized().withSpaceCondition(metav1.ConditionTrue, ReasonNearQuota)
			s.obs.Cluster, s.obs.EtcdErr = nil, members.ErrNoQuorum
			return s
		}(), want: metav1.ConditionTrue, wantReason: ReasonNearQuota, wantReady: ReasonMembersUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Make(tt.s.kvc, tt.s.obs, t0, Config{})
			c := meta.FindStatusCondition(p.Status.Conditions, kvv1.ConditionSpacePressure)
			if c == nil || c.Status != tt.want || c.Reason != tt.wantReason || !strings.Contains(c.Message, tt.wantMessage) {
				t.Errorf("SpacePressure = %+v, want %s %s mentioning %q", c, tt.want, tt.wantReason, tt.wantMessage)
			}
			var got []string
			for _, e := range p.Events {
				if e.Reason == ReasonNearQuota || e.Reason == ReasonNoSpace || e.Reason == EventSpaceRecovered {
					got = append(got, e.Reason)
				}
			}
			if strings.Join(got, ",") != tt.wantEvent {
				t.Errorf("space events %v, want %q", got, tt.wantEvent)
			}
			if ready := meta.FindStatusCondition(p.Status.Conditions, kvv1.ConditionReady); ready == nil || ready.Reason != tt.wantReady {
				t.Errorf("Ready = %+v, want reason %s", ready, tt.wantReady)
			}
		})
	}
}

// TestMemberStatusShowsSpace: each member's database size and size in use, rounded up to a MiB
// (so status changes once per MiB, not on every write), its alarms, and the quota; a member that
// does not answer keeps the sizes last seen.
func TestMemberStatusShowsSpace(t *testing.T) {
	s := sized(10, 20, 30)
	s.member(0).DBSize = 10*mib + 1 // rounds up
	s.obs.Cluster.Alarms = []members.Alarm{{MemberID: 3, Type: "NOSPACE"}}
	st := Make(s.kvc, s.obs, t0, Config{}).Status
	var got []string
	for _, m := range st.Members {
		got = append(got, m.Name+" "+m.DBSize.String()+"/"+m.DBSizeInUse.String()+" "+strings.Join(m.Alarms, ","))
	}
	if want := "kv-0 11Mi/5Mi |kv-1 20Mi/10Mi |kv-2 30Mi/15Mi NOSPACE"; strings.Join(got, "|") != want {
		t.Errorf("members %q, want %q", strings.Join(got, "|"), want)
	}
	if st.BackendQuota == nil || st.BackendQuota.String() != "100Mi" {
		t.Errorf("backendQuota %v, want 100Mi", st.BackendQuota)
	}

	s.kvc.Status = st
	s.member(1).Healthy = false
	s.member(1).DBSize, s.member(1).DBSizeInUse = 0, 0
	if m := Make(s.kvc, s.obs, t0, Config{}).Status.Members[1]; m.DBSize == nil || m.DBSize.String() != "20Mi" {
		t.Errorf("a member that did not answer: %+v, want its last sizes", m)
	}
	// Removed and added back under its name (its volume was lost): a new ID, not the old sizes.
	s.member(1).ID = 42
	if m := Make(s.kvc, s.obs, t0, Config{}).Status.Members[1]; m.DBSize != nil {
		t.Errorf("a member added back under a former member's name shows its sizes: %v", m.DBSize)
	}
	// etcd not answering: health and alarms are unknown, sizes stay as last seen.
	s.obs.Cluster, s.obs.EtcdErr = nil, members.ErrNoQuorum
	if m := Make(s.kvc, s.obs, t0, Config{}).Status.Members[2]; len(m.Alarms) != 0 || m.DBSize.String() != "30Mi" {
		t.Errorf("etcd not answering: %+v, want no alarms and the last sizes", m)
	}
}
