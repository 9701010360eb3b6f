package controllers

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/members/memberstest"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

func (h *harness) job(ns, name string) (*batchv1.Job, bool) {
	h.t.Helper()
	job := &batchv1.Job{}
	err := h.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, job)
	if client.IgnoreNotFound(err) != nil {
		h.t.Fatal(err)
	}
	return job, err == nil
}

// TestDeletionStepTimeLimitsCountFromEachStepsStart: a final backup that takes longer than the
// deregistration's time limit must not make the deregistration be skipped, and a step is given
// up only once its own Job ran past its limit.
func TestDeletionStepTimeLimitsCountFromEachStepsStart(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("steplimits")
	kvc := withHTTPDeregistration(withBackups(newKVCluster(ns, "kv", 1), ""))
	kvc.Spec.Backup.FinalBackupTimeoutSeconds = 600
	kvc.Spec.Deregistration.TimeoutSeconds = 30
	h.readyCluster(kvc)
	h.deleteAndReconcile(kvc)
	final, ok := h.job(ns, "kv-final")
	if !ok {
		t.Fatal("no final backup Job")
	}
	h.clock.SetTime(h.clock.Now().Add(5 * time.Minute)) // a long final backup, longer than the deregistration's limit
	h.finishJob(final, true, successReport("team/"+ns+"/kv/uid/kv-final-x.db"))
	h.reconcile(kvc)
	if _, ok := h.job(ns, "kv-deregister"); !ok {
		t.Fatalf("the deregistration was skipped after a long final backup; events: %s", drainEvents(h))
	}
	h.reconcile(kvc)
	if h.gone(kvc) {
		t.Fatal("deleted while the deregistration runs")
	}
	h.clock.SetTime(h.clock.Now().Add(30*time.Second + time.Minute + time.Second))
	h.reconcileGone(kvc, "Warning DeregistrationFailed", "did not finish within 30s") // given up after its own limit (Proceed)
}

// TestDeletingTheNamespaceNeverHangsAndTheLossIsCounted: in a namespace being deleted no Job can
// start and the members are going: even with Block the deletion goes on (holding it protects
// nothing), and the lost final backup is logged and counted in the operator's metrics, which
// outlive the namespace (its events cannot be written any more).
func TestDeletingTheNamespaceNeverHangsAndTheLossIsCounted(t *testing.T) {
	for _, policy := range []kvv1.FinalBackupFailurePolicy{kvv1.FinalBackupProceed, kvv1.FinalBackupBlock} {
		t.Run(string(policy), func(t *testing.T) {
			h := newHarness(t)
			ns := h.namespace("nsgone")
			kvc := withBackups(newKVCluster(ns, "kv", 1), "")
			kvc.Spec.Backup.OnFinalBackupFailure = policy
			h.readyCluster(kvc)
			lost := testutil.ToFloat64(finalBackupsLost.WithLabelValues("namespace_deleted"))
			// envtest runs no namespace controller: the namespace stays Terminating, as while a
			// real one waits for its contents to go, and it refuses new objects such as a Job.
			if err := h.client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			// The namespace controller deletes the members' StatefulSet as soon as anything else.
			if err := h.client.Delete(context.Background(), &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kv"}}); err != nil {
				t.Fatal(err)
			}
			h.deleteAndReconcile(kvc)
			if !h.gone(kvc) {
				t.Fatalf("the KVCluster held its namespace's deletion: %+v", h.fresh(kvc).Status.Deletion)
			}
			if got := testutil.ToFloat64(finalBackupsLost.WithLabelValues("namespace_deleted")); got != lost+1 {
				t.Errorf("kvcluster_final_backups_lost_total{reason=namespace_deleted} went from %v to %v, want one more", lost, got)
			}
			if ev := drainEvents(h); !strings.Contains(ev, "namespace is being deleted") || !strings.Contains(ev, "no backup of this cluster exists") {
				t.Errorf("events = %q, want why no final backup was taken and what is lost", ev)
			}
		})
	}
}

// TestAFinalBackupThatFinishedBeforeTheNamespacesDeletionCounts: a final backup Job that
// succeeded just before its namespace was deleted, while no pass had recorded it yet, is recorded
// as the final backup, not counted lost.
func TestAFinalBackupThatFinishedBeforeTheNamespacesDeletionCounts(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("nsgone-after")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 1), ""))
	h.deleteAndReconcile(kvc) // drains, fences after drainSeconds, starts the final backup
	final, ok := h.job(ns, "kv-final")
	if !ok {
		t.Fatalf("no final backup Job; events: %s", drainEvents(h))
	}
	h.finishJob(final, true, successReport("team/"+ns+"/kv/uid/kv-final-x.db"))
	lost := testutil.ToFloat64(finalBackupsLost.WithLabelValues("namespace_deleted"))
	if err := h.client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	h.reconcile(kvc)
	if !h.gone(kvc) {
		t.Fatalf("the KVCluster held its namespace's deletion: %+v", h.fresh(kvc).Status.Deletion)
	}
	if got := testutil.ToFloat64(finalBackupsLost.WithLabelValues("namespace_deleted")); got != lost {
		t.Errorf("a final backup that was taken is counted lost (kvcluster_final_backups_lost_total{reason=namespace_deleted} %v → %v)", lost, got)
	}
	if ev := drainEvents(h); !strings.Contains(ev, "kv-final-x.db") {
		t.Errorf("events = %q, want the final backup's location", ev)
	}
}

// TestFinalBackupWaitsForDrainedClientsAndFencedWrites: before the final backup the client
// Service stops taking connections, clients get drainSeconds, and writes are fenced, so the
// backup holds the cluster's last state; its record and event say so.
func TestFinalBackupWaitsForDrainedClientsAndFencedWrites(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("drain")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 3), ""))
	if err := h.client.Delete(context.Background(), h.fresh(kvc)); err != nil {
		t.Fatal(err)
	}
	h.reconcile(kvc)
	var svc corev1.Service
	h.get(&svc, ns, "kv-client")
	if svc.Spec.Selector["kvcluster.io/drained"] != "true" || svc.Annotations[specs.DrainedAtAnnotation] == "" {
		t.Errorf("the client Service still selects the members: %v", svc.Spec.Selector)
	}
	if _, started := h.job(ns, "kv-final"); started || slices.Contains(h.members.takeCalls(), "fence") {
		t.Fatal("the final backup started, or writes were fenced, before clients had their drain time")
	}
	h.clock.SetTime(h.clock.Now().Add(5 * time.Second))
	h.reconcile(kvc)
	if _, started := h.job(ns, "kv-final"); started {
		t.Fatal("the final backup started before drainSeconds (10) passed")
	}
	h.clock.SetTime(h.clock.Now().Add(6 * time.Second))
	h.reconcile(kvc)
	if calls := h.members.takeCalls(); !slices.Equal(calls, []string{"fence"}) {
		t.Errorf("etcd calls = %v, want writes fenced once", calls)
	}
	final, started := h.job(ns, "kv-final")
	if !started || final.Annotations[specs.WritesFencedAnnotation] != "4242" {
		t.Fatalf("final backup Job started %t, annotations %v; want it to start after the fence at revision 4242", started, final.Annotations)
	}
	drain, _ := plan.FindStep(h.fresh(kvc).Status.Deletion, kvv1.StepDrain)
	if drain.Outcome != kvv1.DeletionSucceeded || drain.Revision != 4242 {
		t.Errorf("drain step = %+v", drain)
	}
	// The fence is a NOSPACE alarm of a member of the cluster's own, with room to spare: it is
	// never taken for one to recover from while the final backup runs.
	h.reconcile(kvc)
	h.reconcile(kvc)
	if calls := h.members.takeCalls(); len(calls) != 0 {
		t.Errorf("etcd calls while the final backup runs: %v, want the fence left alone", calls)
	}
	h.finishJob(final, true, successReport("team/"+ns+"/kv/uid/kv-final-x.db"))
	h.reconcileGone(kvc, "DrainStarted", "WritesFenced", "fenced at revision 4242", "writes were fenced at revision 4242: it holds the cluster's last state")
}

// TestAForegroundDeletionFencesATLSCluster: in a foreground deletion (Argo CD's prunes) the
// garbage collector takes the KVCluster off the owners of its TLS Secrets, which its guard still
// owns; the operator must still fence writes with the cluster's client certificate, or the final
// backup misses every write acknowledged after it began.
func TestAForegroundDeletionFencesATLSCluster(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("tlsfence")
	kvc := withBackups(newKVCluster(ns, "kv", 3), "")
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	kvc = h.readyCluster(kvc)
	if err := h.client.Delete(context.Background(), h.fresh(kvc), client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
		t.Fatal(err)
	}
	var secrets corev1.SecretList
	if err := h.client.List(context.Background(), &secrets, client.InNamespace(ns)); err != nil || len(secrets.Items) < 4 {
		t.Fatalf("TLS Secrets %d, %v", len(secrets.Items), err)
	}
	for i := range secrets.Items { // what the garbage collector does to a dependent with another owner
		s := &secrets.Items[i]
		s.OwnerReferences = slices.DeleteFunc(s.OwnerReferences, func(r metav1.OwnerReference) bool { return r.Kind == "KVCluster" })
		if len(s.OwnerReferences) == 0 {
			t.Fatalf("Secret %s has no owner but the KVCluster: a foreground deletion would delete it before the final backup", s.Name)
		}
		if err := h.client.Update(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	h.reconcile(kvc)
	h.clock.SetTime(h.clock.Now().Add(11 * time.Second))
	h.reconcile(kvc)
	if calls := h.members.takeCalls(); !slices.Equal(calls, []string{"fence"}) {
		t.Errorf("etcd calls = %v, want writes fenced once, with the cluster's client certificate", calls)
	}
	if ev := drainEvents(h); !strings.Contains(ev, "WritesFenced") {
		t.Errorf("events = %q, want WritesFenced", ev)
	}
}

// TestTheGuardOwnsWhatTheFinalBackupNeeds: while a cluster has deletion steps, a guard ConfigMap
// owned by no one is a second owner of the members' StatefulSet, the peer Service and the
// membership ConfigMap, so even a foreground deletion (Argo CD's default for prunes) leaves them
// to the final backup; once the steps ran, the operator deletes the guard and the garbage
// collector takes the rest. Without deletion steps there is no guard.
func TestTheGuardOwnsWhatTheFinalBackupNeeds(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("guard")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 3), ""))
	var guard corev1.ConfigMap
	h.get(&guard, ns, "kv-guard")
	if len(guard.OwnerReferences) != 0 {
		t.Errorf("the guard must be owned by no one: %v", guard.OwnerReferences)
	}
	guarded := func() map[string]bool {
		out := map[string]bool{}
		for what, obj := range map[string]client.Object{"StatefulSet kv": &appsv1.StatefulSet{}, "Service kv-peer": &corev1.Service{},
			"ConfigMap kv-members": &corev1.ConfigMap{}, "Service kv-client": &corev1.Service{}} {
			h.get(obj, ns, strings.Fields(what)[1])
			out[what] = slices.ContainsFunc(obj.GetOwnerReferences(), func(r metav1.OwnerReference) bool { return r.UID == guard.UID })
		}
		return out
	}
	want := map[string]bool{"StatefulSet kv": true, "Service kv-peer": true, "ConfigMap kv-members": true, "Service kv-client": false}
	if got := guarded(); !maps.Equal(got, want) {
		t.Errorf("guarded objects = %v, want %v", got, want)
	}
	h.assertIdle(kvc, "with a guard")

	// No deletion step wanted any more: the guard goes, after its objects stopped naming it.
	h.setSpec(kvc, func(k *kvv1.KVCluster) { k.Spec.Backup = nil })
	h.reconcile(kvc)
	if got := guarded(); !maps.Equal(got, map[string]bool{"StatefulSet kv": false, "Service kv-peer": false, "ConfigMap kv-members": false, "Service kv-client": false}) {
		t.Errorf("after the backup was removed, guarded objects = %v", got)
	}
	if err := h.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "kv-guard"}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("the guard outlived the deletion steps: %v", err)
	}

	// With deletion steps again, the guard goes only once they ran.
	h.setSpec(kvc, func(k *kvv1.KVCluster) { withBackups(k, "") })
	h.reconcile(kvc)
	h.get(&guard, ns, "kv-guard")
	h.deleteAndReconcile(kvc)
	h.get(&guard, ns, "kv-guard") // still there while the final backup runs
	final, _ := h.job(ns, "kv-final")
	if !slices.ContainsFunc(final.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == guard.UID }) {
		t.Errorf("the final backup Job is not guarded: %v", final.OwnerReferences)
	}
	h.finishJob(final, true, successReport("team/"+ns+"/kv/uid/kv-final-x.db"))
	h.reconcile(kvc)
	if !h.gone(kvc) {
		t.Fatal("still there after the final backup")
	}
	if err := h.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "kv-guard"}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("the guard outlived the deletion: %v", err)
	}
}

// TestStaleAlarmsOfARestoredClusterAreDisarmed: a cluster restored from a final backup starts
// with the NOSPACE alarm the fence raised in the cluster the backup came from; it is not Ready
// (etcd refuses writes) until the operator disarmed it (an alarm of a member of its own is
// space to free: TestNoSpaceIsRecoveredWithoutAPerson).
func TestStaleAlarmsOfARestoredClusterAreDisarmed(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("alarms")
	kvc := newKVCluster(ns, "kv", 3)
	h.create(kvc)
	answer := memberstest.Healthy(kvc, 3, "3.7.3")
	answer.Alarms = []members.Alarm{{MemberID: 0xdead, Type: "NOSPACE"}}
	h.members.set(answer, nil)
	h.reconcile(kvc)
	h.setMembersReady(kvc, 3)
	h.reconcile(kvc)
	if got := h.fresh(kvc); got.Status.Phase == kvv1.PhaseReady && meta.IsStatusConditionTrue(got.Status.Conditions, kvv1.ConditionReady) {
		t.Error("Ready while etcd refuses writes under an alarm")
	}
	if calls := h.members.takeCalls(); !slices.Equal(calls, []string{"disarm NOSPACE dead"}) {
		t.Errorf("etcd calls = %v, want the stale alarm disarmed", calls)
	}
	h.reconcile(kvc)
	if got := h.fresh(kvc); !meta.IsStatusConditionTrue(got.Status.Conditions, kvv1.ConditionReady) {
		t.Errorf("not Ready once the stale alarm was disarmed: %+v", meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionReady))
	}
	if ev := drainEvents(h); !strings.Contains(ev, "StaleAlarmDisarmed") {
		t.Errorf("events = %q, want StaleAlarmDisarmed", ev)
	}

}

// TestForegroundDeletionKeepsTheStepsJobs: a foreground deletion takes the KVCluster off the
// owners of its guarded Jobs (the garbage collector keeps them for the guard): the step they run
// goes on, instead of taking them for someone else's.
func TestForegroundDeletionKeepsTheStepsJobs(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("fgjobs")
	kvc := h.readyCluster(withHTTPDeregistration(newKVCluster(ns, "kv", 1)))
	h.deleteAndReconcile(kvc)
	dereg, ok := h.job(ns, "kv-deregister")
	if !ok {
		t.Fatal("no deregistration Job")
	}
	// What the garbage collector does to a dependent that still has another owner.
	dereg.OwnerReferences = slices.DeleteFunc(dereg.OwnerReferences, func(r metav1.OwnerReference) bool { return r.Kind == "KVCluster" })
	if err := h.client.Update(context.Background(), dereg); err != nil {
		t.Fatal(err)
	}
	h.reconcile(kvc)
	if step, _ := plan.FindStep(h.fresh(kvc).Status.Deletion, kvv1.StepDeregistration); step.Outcome != kvv1.DeletionRunning {
		t.Fatalf("deregistration step = %+v, want it still running", step)
	}
	h.finishJob(dereg, true, "POST https://registry.example/… succeeded")
	h.reconcile(kvc)
	if ev := drainEvents(h); !h.gone(kvc) || !strings.Contains(ev, "DeregistrationSucceeded") {
		t.Errorf("gone %t, events %q; want the deregistration to have succeeded", h.gone(kvc), ev)
	}
}

// TestOrphanDeletionLeavesTheMembersRunning: deleted with --cascade=orphan the members are meant
// to keep running: they are neither drained nor fenced, and the guard keeps owning them, whether
// the operator sees the orphan finalizer or only what the garbage collector left after it.
func TestOrphanDeletionLeavesTheMembersRunning(t *testing.T) {
	for _, seen := range []string{"the orphan finalizer", "the orphaned PodDisruptionBudget"} {
		t.Run(seen, func(t *testing.T) {
			h := newHarness(t)
			ns := h.namespace("orphan")
			kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 1), ""))
			ctx := context.Background()
			if err := h.client.Delete(ctx, h.fresh(kvc), client.PropagationPolicy(metav1.DeletePropagationOrphan)); err != nil {
				t.Fatal(err)
			}
			if seen == "the orphaned PodDisruptionBudget" { // the garbage collector was faster
				var pdb policyv1.PodDisruptionBudget
				h.get(&pdb, ns, "kv")
				pdb.OwnerReferences = nil
				if err := h.client.Update(ctx, &pdb); err != nil {
					t.Fatal(err)
				}
				got := h.fresh(kvc)
				got.Finalizers = slices.DeleteFunc(got.Finalizers, func(f string) bool { return f == metav1.FinalizerOrphanDependents })
				if err := h.client.Update(ctx, got); err != nil {
					t.Fatal(err)
				}
			}
			h.reconcile(kvc)
			if !h.gone(kvc) {
				t.Fatalf("still there: %+v", h.fresh(kvc).Status.Deletion)
			}
			if calls := h.members.takeCalls(); len(calls) != 0 {
				t.Errorf("etcd calls = %v: the members meant to keep running were fenced", calls)
			}
			var svc corev1.Service
			h.get(&svc, ns, "kv-client")
			if _, drained := svc.Spec.Selector["kvcluster.io/drained"]; drained {
				t.Error("the client Service was drained")
			}
			var guard corev1.ConfigMap
			h.get(&guard, ns, "kv-guard")
			if guard.Annotations[specs.OrphanedAnnotation] != "true" {
				t.Errorf("the guard is not marked as keeping orphaned members: %v", guard.Annotations)
			}
		})
	}
}

// TestSkippingABlockedFinalBackupStillDeregisters: a final backup that failed and held the
// deletion (Block) for an hour, then skipped by the annotation: the deregistration's time limit
// counts from then, so it still runs. And a step is never given up unattempted.
func TestSkippingABlockedFinalBackupStillDeregisters(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("skiplater")
	kvc := withHTTPDeregistration(withBackups(newKVCluster(ns, "kv", 1), ""))
	kvc.Spec.Backup.OnFinalBackupFailure = kvv1.FinalBackupBlock
	kvc.Spec.Deregistration.TimeoutSeconds = 30
	h.readyCluster(kvc)
	h.deleteAndReconcile(kvc)
	final, _ := h.job(ns, "kv-final")
	h.finishJob(final, false, "backup failed: the bucket does not exist")
	h.reconcile(kvc)
	h.clock.SetTime(h.clock.Now().Add(time.Hour))
	h.reconcile(kvc)
	h.setAnnotation(kvc, kvv1.AnnotationSkipFinalBackup, "true")
	h.reconcile(kvc)
	if _, ok := h.job(ns, "kv-deregister"); !ok {
		t.Fatalf("no deregistration after the final backup was skipped: %+v; events: %s", h.fresh(kvc).Status.Deletion, drainEvents(h))
	}
}

// TestAnOperatorBackLateStillTakesTheFinalBackup: the final backup Job could not be created (the
// API server failed), then the operator was down for longer than the backup's time limit; back,
// it takes the backup rather than giving it up unattempted.
func TestAnOperatorBackLateStillTakesTheFinalBackup(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("late")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 1), ""))
	operator := h.r.Client
	h.r.Client = interceptor.NewClient(operator.(client.WithWatch), interceptor.Funcs{
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			if _, isJob := obj.(*batchv1ac.JobApplyConfiguration); isJob {
				return apierrors.NewServiceUnavailable("the API server is restarting")
			}
			return c.Apply(ctx, obj, opts...)
		},
	})
	if err := h.client.Delete(context.Background(), h.fresh(kvc)); err != nil {
		t.Fatal(err)
	}
	h.reconcile(kvc) // drains
	h.clock.SetTime(h.clock.Now().Add(11 * time.Second))
	if _, err := h.r.Reconcile(context.Background(), requestFor(kvc)); err == nil {
		t.Fatal("the Job's creation failed, but the reconcile did not say so")
	}
	h.r.Client = operator
	h.clock.SetTime(h.clock.Now().Add(time.Hour)) // the operator was down
	h.reconcile(kvc)
	if _, ok := h.job(ns, "kv-final"); !ok {
		t.Fatalf("no final backup: %+v", h.fresh(kvc).Status.Deletion)
	}
	if calls := h.members.takeCalls(); !slices.Equal(calls, []string{"fence"}) {
		t.Errorf("etcd calls = %v, want writes fenced once (the drain's outcome kept across the failed pass)", calls)
	}
}

// TestAClusterWithoutMembersOfItsOwnIsNeitherFencedNorBackedUp: a cluster stopped from the start
// (its StatefulSet is someone else's) takes no scheduled backup, and its deletion neither fences
// nor backs up what answers at its members' names.
func TestAClusterWithoutMembersOfItsOwnIsNeitherFencedNorBackedUp(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("notmine")
	other := h.readyCluster(newKVCluster(ns, "kv", 1))
	if err := h.client.Delete(context.Background(), other); err != nil { // its objects stay a while
		t.Fatal(err)
	}
	kvc := withBackups(newKVCluster(ns, "kv", 1), "* * * * *")
	h.create(kvc)
	h.reconcile(kvc)
	h.clock.SetTime(h.clock.Now().Add(3 * time.Minute))
	h.reconcile(kvc)
	if jobs := h.backupJobs(kvc); len(jobs) != 0 {
		t.Errorf("backed up someone else's members: %v", names(jobs))
	}
	h.deleteAndReconcile(kvc)
	if !h.gone(kvc) {
		t.Fatalf("still there: %+v", h.fresh(kvc).Status.Deletion)
	}
	if calls := h.members.takeCalls(); len(calls) != 0 {
		t.Errorf("etcd calls = %v: someone else's cluster was fenced", calls)
	}
	if _, ok := h.job(ns, "kv-final"); ok {
		t.Error("a final backup of someone else's members was started")
	}
}

// TestAFenceEtcdRefusesIsTriedAgain: one refused fence does not send the final backup off
// unfenced.
func TestAFenceEtcdRefusesIsTriedAgain(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("refence")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 1), ""))
	h.members.fenceErrs = []error{errors.New("etcdserver: request timed out")}
	h.deleteAndReconcile(kvc)
	h.clock.SetTime(h.clock.Now().Add(5 * time.Second))
	h.reconcile(kvc)
	if calls := h.members.takeCalls(); !slices.Equal(calls, []string{"fence refused", "fence"}) {
		t.Errorf("etcd calls = %v, want the refused fence tried again", calls)
	}
	final, ok := h.job(ns, "kv-final")
	if !ok || final.Annotations[specs.WritesFencedAnnotation] != "4242" {
		t.Errorf("final backup started %t, annotations %v; want it fenced", ok, final.Annotations)
	}
}

// TestDeletionStepsDoNotRunTwiceOnAStaleCache: the manager's cache may still show the KVCluster
// as it was before the last pass wrote its status; the steps are read afresh, so writes are fenced
// and each step announced once.
func TestDeletionStepsDoNotRunTwiceOnAStaleCache(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("stale")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 1), ""))
	if err := h.client.Delete(context.Background(), h.fresh(kvc)); err != nil {
		t.Fatal(err)
	}
	stale := h.fresh(kvc) // deleting, with no step recorded yet
	h.r.Client = interceptor.NewClient(h.r.Client.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if k, ok := obj.(*kvv1.KVCluster); ok && key.Name == "kv" {
				stale.DeepCopyInto(k)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	for range 3 {
		h.reconcile(kvc)
		h.clock.SetTime(h.clock.Now().Add(6 * time.Second))
	}
	if calls := h.members.takeCalls(); !slices.Equal(calls, []string{"fence"}) {
		t.Errorf("etcd calls = %v, want one fence", calls)
	}
	ev := drainEvents(h)
	for _, once := range []string{"DrainStarted", "WritesFenced", "FinalBackupStarted"} {
		if n := strings.Count(ev, once); n != 1 {
			t.Errorf("%s said %d times, want once:\n%s", once, n, ev)
		}
	}
}

// TestARestoredClusterStartsWithoutItsBackupsAlarms: restored under the same name as the cluster
// its backup came from, a cluster's members have that cluster's member IDs, so the fence alarm in
// the final backup looks like one of its own: it is cleared while the restored cluster forms.
func TestARestoredClusterStartsWithoutItsBackupsAlarms(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("samename")
	kvc := newKVCluster(ns, "kv", 3)
	kvc.Spec.Restore = &kvv1.RestoreSpec{PVC: &kvv1.PVCDestination{ClaimName: "backups"}, Key: "ns/kv/uid/kv-final-20261130T101500Z.db"}
	h.create(kvc)
	answer := memberstest.Healthy(kvc, 3, "3.7.3")
	answer.Alarms = []members.Alarm{{MemberID: 1, Type: "NOSPACE"}} // member 1 is kv-0
	h.members.set(answer, nil)
	h.reconcile(kvc)
	h.setMembersReady(kvc, 3)
	h.reconcile(kvc)
	if calls := h.members.takeCalls(); !slices.Equal(calls, []string{"disarm NOSPACE 1"}) {
		t.Errorf("etcd calls = %v, want the restored fence alarm disarmed", calls)
	}
	h.reconcile(kvc)
	// Formed, it goes on (to restart its members onto the template without the restore).
	if got := h.fresh(kvc); got.Status.Phase == kvv1.PhaseCreating || strings.Contains(meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionReady).Message, "alarm") {
		t.Errorf("still held by the alarm once it was disarmed: phase %s, %+v", got.Status.Phase, meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionReady))
	}
}

// TestAFinalBackupIsRecordedFromItsReportEvenWhenTheCacheLags: the cache may show the final
// backup Job finished before it shows its pod's termination message; the report (where the
// backup went, at which revision) is then read on the API server, not recorded empty.
func TestAFinalBackupIsRecordedFromItsReportEvenWhenTheCacheLags(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("reportlag")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 1), ""))
	h.deleteAndReconcile(kvc)
	final, _ := h.job(ns, "kv-final")
	h.finishJob(final, true, successReport("team/"+ns+"/kv/uid/kv-final-x.db"))
	h.r.Client = interceptor.NewClient(h.r.Client.(client.WithWatch), interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			if pods, ok := list.(*corev1.PodList); ok { // the pods' final status is not cached yet
				for i := range pods.Items {
					pods.Items[i].Status = corev1.PodStatus{}
				}
			}
			return nil
		},
	})
	h.reconcileGone(kvc, "FinalBackupCompleted final backup kv-final wrote s3://backups/team/"+ns+"/kv/uid/kv-final-x.db")
}
