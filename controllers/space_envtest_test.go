package controllers

import (
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
)

// TestNoSpaceIsRecoveredWithoutAPerson: etcd raised NOSPACE on a Ready cluster whose databases are
// mostly old revisions, which the sizes etcd reports do not show freed after the compaction.
// Reconcile by reconcile the operator announces it, compacts, defragments the followers and then
// the leader, and disarms the alarm; status and events say so at each step, and the cluster is
// Ready again. When the data itself fills the quota, it compacts and defragments each member
// once, then disarms nothing, does nothing more, and the condition says what a person can do.
func TestNoSpaceIsRecoveredWithoutAPerson(t *testing.T) {
	h := newHarness(t)
	kvc := h.readyCluster(newKVCluster(h.namespace("nospace"), "kv", 3))
	const mib = 1 << 20
	full := func(revision, live int64) {
		h.members.update(func(c *members.Cluster) {
			for i := range c.Members {
				m := &c.Members[i]
				m.Revision, m.DBSize, m.DBSizeInUse, m.DBSizeQuota = revision, 100*mib, 100*mib, 100*mib
			}
			c.Alarms = []members.Alarm{{MemberID: 2, Type: "NOSPACE"}}
		})
		h.members.liveBytes = live
	}
	full(5000, 3*mib)
	var calls []string
	for range 7 {
		h.clock.SetTime(h.clock.Now().Add(time.Millisecond)) // as time passes between reconciles
		h.reconcile(kvc)
		calls = append(calls, h.members.takeCalls()...)
		if got := h.fresh(kvc); len(calls) == 1 && (got.Status.Phase != kvv1.PhaseReady || meta.IsStatusConditionTrue(got.Status.Conditions, kvv1.ConditionReady)) {
			t.Errorf("while writes are refused: phase %s, Ready %+v; want Ready phase, Ready condition False", got.Status.Phase, meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionReady))
		}
	}
	want := []string{"compact 5000", "defragment kv-1", "defragment kv-2", "defragment kv-0", "disarm NOSPACE 2"}
	if !slices.Equal(calls, want) {
		t.Errorf("etcd calls = %q, want %q", calls, want)
	}
	got := h.fresh(kvc)
	if !meta.IsStatusConditionTrue(got.Status.Conditions, kvv1.ConditionReady) || meta.IsStatusConditionTrue(got.Status.Conditions, kvv1.ConditionSpacePressure) {
		t.Errorf("after freeing space: %+v", got.Status.Conditions)
	}
	h.assertIdle(kvc, "recovered, the compaction and defragmentations recorded")
	if c := got.Status.LastCompaction; c == nil || c.Revision != 5000 || c.DisarmedTime == nil || !c.Time.Before(c.DisarmedTime) {
		t.Errorf("status.lastCompaction = %+v, want revision 5000, disarmed after it", c)
	}
	for _, m := range got.Status.Members {
		if m.LastDefragmentTime == nil || !got.Status.LastCompaction.Time.Before(m.LastDefragmentTime) {
			t.Errorf("%s: lastDefragmentTime %v, want a time after the compaction", m.Name, m.LastDefragmentTime)
		}
	}
	ev := drainEvents(h)
	for _, want := range []string{plan.ReasonNoSpace, plan.EventSpaceCompacted, "MemberDefragmented defragmented kv-1", plan.EventNoSpaceDisarmed, plan.EventSpaceRecovered} {
		if !strings.Contains(ev, want) {
			t.Errorf("events lack %q:\n%s", want, ev)
		}
	}
	if strings.Contains(ev, plan.ReasonSpaceExhausted) || strings.Contains(ev, plan.EventFreeSpaceFailed) {
		t.Errorf("a recovery that went well told of trouble:\n%s", ev)
	}

	// Written full again, with data this time: compaction frees nothing, defragmentation nothing.
	full(6000, 100*mib)
	for range 8 {
		h.clock.SetTime(h.clock.Now().Add(time.Millisecond))
		h.reconcile(kvc)
	}
	want = []string{"compact 6000", "defragment kv-1", "defragment kv-2", "defragment kv-0"}
	if calls := h.members.takeCalls(); !slices.Equal(calls, want) {
		t.Errorf("etcd calls with no room to make: %q, want %q and nothing more", calls, want)
	}
	c := meta.FindStatusCondition(h.fresh(kvc).Status.Conditions, kvv1.ConditionSpacePressure)
	if c == nil || c.Reason != plan.ReasonSpaceExhausted || !strings.Contains(c.Message, "Delete keys") {
		t.Errorf("SpacePressure = %+v, want SpaceExhausted saying what to do", c)
	}
	if ev := drainEvents(h); !strings.Contains(ev, "Warning SpaceExhausted") {
		t.Errorf("events lack the SpaceExhausted warning:\n%s", ev)
	}
}

// TestRoutineDefragmentation: on a Ready cluster whose databases reached half the quota, mostly
// free pages, the operator defragments the followers and then the leader, one per reconcile,
// records each in status, and then leaves them be; with mode Off it defragments nothing.
func TestRoutineDefragmentation(t *testing.T) {
	h := newHarness(t)
	const mib = 1 << 20
	fragmented := func(c *members.Cluster) {
		for i := range c.Members {
			m := &c.Members[i]
			m.Revision, m.DBSize, m.DBSizeInUse, m.DBSizeQuota = 5000, 60*mib, 10*mib, 100*mib
		}
	}
	off := newKVCluster(h.namespace("defrag-off"), "kv", 3)
	off.Spec.Space.Defragmentation.Mode = kvv1.DefragmentationOff
	off = h.readyCluster(off)
	h.members.update(fragmented)
	for range 3 {
		h.reconcile(off)
	}
	if calls := h.members.takeCalls(); len(calls) != 0 {
		t.Errorf("with defragmentation mode Off: etcd calls %q", calls)
	}

	kvc := h.readyCluster(newKVCluster(h.namespace("defrag"), "kv", 3))
	h.members.update(fragmented)
	var calls []string
	for range 5 {
		h.clock.SetTime(h.clock.Now().Add(time.Second))
		h.reconcile(kvc)
		calls = append(calls, h.members.takeCalls()...)
	}
	if want := []string{"defragment kv-1", "defragment kv-2", "defragment kv-0"}; !slices.Equal(calls, want) {
		t.Errorf("etcd calls = %q, want %q", calls, want)
	}
	for _, m := range h.fresh(kvc).Status.Members {
		if m.LastDefragmentTime == nil || m.DBSize.Value() != 10*mib {
			t.Errorf("%s: lastDefragmentTime %v, dbSize %v; want a time and 10Mi", m.Name, m.LastDefragmentTime, m.DBSize)
		}
	}
	if ev := drainEvents(h); strings.Count(ev, "MemberDefragmented defragmented") != 3 {
		t.Errorf("events, want one MemberDefragmented per member:\n%s", ev)
	}
	h.assertIdle(kvc, "every member defragmented and recorded")
}

// TestDefragmentNowDefragmentsEveryMemberOncePerToken: kvcluster.io/defragment-now=<token> on a
// Ready cluster whose databases are too small for routine defragmentation defragments the
// followers and then the leader, one a reconcile, and status.defragmentRequest and the events say
// so; the same token does nothing more (the cluster is idle again), a new one defragments every
// member again.
func TestDefragmentNowDefragmentsEveryMemberOncePerToken(t *testing.T) {
	h := newHarness(t)
	kvc := h.readyCluster(newKVCluster(h.namespace("defragnow"), "kv", 3))
	drainEvents(h)
	ask := func(token string) []string {
		h.setAnnotation(kvc, kvv1.AnnotationDefragmentNow, token)
		for range 5 {
			h.clock.SetTime(h.clock.Now().Add(time.Millisecond))
			h.reconcile(kvc)
		}
		return h.members.takeCalls()
	}
	want := []string{"defragment kv-1", "defragment kv-2", "defragment kv-0"}
	if calls := ask("2026-12-03T08:00"); !slices.Equal(calls, want) {
		t.Errorf("etcd calls = %q, want %q", calls, want)
	}
	req := h.fresh(kvc).Status.DefragmentRequest
	if req == nil || req.Token != "2026-12-03T08:00" || req.State != kvv1.BackupRequestSucceeded || !slices.Equal(req.Defragmented, []string{"kv-1", "kv-2", "kv-0"}) || req.StartTime == nil {
		t.Errorf("status.defragmentRequest = %+v, want Succeeded for the token, kv-1, kv-2, kv-0", req)
	}
	ev := drainEvents(h)
	for _, want := range []string{plan.EventDefragmentationStarted, "defragmented kv-2 in", "defragmented kv-0 (the leader) in", "asked for with kvcluster.io/defragment-now=2026-12-03T08:00", plan.EventDefragmentationFinished} {
		if !strings.Contains(ev, want) {
			t.Errorf("events lack %q:\n%s", want, ev)
		}
	}
	h.assertIdle(kvc, "the defragmentation asked for done")
	if calls := h.members.takeCalls(); len(calls) != 0 {
		t.Errorf("an answered token defragmented again: %q", calls)
	}
	if calls := ask("2026-12-03T09:00"); !slices.Equal(calls, want) {
		t.Errorf("a new token: etcd calls = %q, want %q", calls, want)
	}
}
