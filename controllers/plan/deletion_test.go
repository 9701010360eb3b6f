package plan

import (
	"errors"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// deleted is a formed cluster backed up to a bucket, deleted at t0, with the steps' records given.
func deleted(steps ...kvv1.DeletionStep) *kvv1.KVCluster {
	kvc := backedUp("")
	kvc.Spec.Backup.DrainSeconds = ptr.To[int32](10)
	kvc.Spec.Backup.FinalBackupTimeoutSeconds = 600
	at := metav1.NewTime(t0)
	kvc.DeletionTimestamp = &at
	kvc.Finalizers = []string{kvv1.FinalizerFinalBackup}
	kvc.Status.Deletion = steps
	return kvc
}

func step(name kvv1.DeletionStepName, outcome kvv1.DeletionOutcome, started time.Time, rev int64) kvv1.DeletionStep {
	s := metav1.NewTime(started)
	rec := kvv1.DeletionStep{Name: name, Outcome: outcome, StartTime: &s, Revision: rev}
	if name == kvv1.StepFinalBackup {
		rec.Job = "kv-final"
	}
	if outcome == kvv1.DeletionSucceeded {
		rec.CompletionTime = &s
	}
	return rec
}

// finalJob is the final backup's Job, finished as condition says ("" while it runs), with report.
func finalJob(condition batchv1.JobConditionType, report string) map[string]StepJob {
	j := backupJobAt("kv-final", condition, t0.Add(time.Minute))
	j.Job.CreationTimestamp = metav1.NewTime(t0.Add(20 * time.Second))
	j.Report = report
	return map[string]StepJob{"kv-final": {Job: j}}
}

// TestTheDeletionSteps: the deletion steps, pass by pass, as a user reads them in status and events.
func TestTheDeletionSteps(t *testing.T) {
	ours := DeletionObservation{OwnMembers: true, ClientServiceWritable: true, Guard: "guard-uid"}
	with := func(change func(o *DeletionObservation)) DeletionObservation {
		o := ours
		change(&o)
		return o
	}
	drainedAt := t0
	drained := with(func(o *DeletionObservation) { o.DrainedAt = &drainedAt })
	draining := step(kvv1.StepDrain, kvv1.DeletionRunning, t0, 0)
	saidRec := draining
	saidRec.Message = "the client Service takes no new connections; clients have 10s to finish before writes are fenced"
	said := deleted(saidRec)
	fenced := step(kvv1.StepDrain, kvv1.DeletionSucceeded, t0.Add(10*time.Second), 42)
	refused := errors.New("etcd refused")
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "jobs"}, "kv-final", errors.New("quota"))
	terminating := &apierrors.StatusError{ErrStatus: metav1.Status{Reason: metav1.StatusReasonForbidden,
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause}}}}}
	blocking := deleted(fenced)
	blocking.Spec.Backup.OnFinalBackupFailure = kvv1.FinalBackupBlock
	skip := deleted()
	skip.Spec.Backup.FinalBackup = kvv1.FinalBackupSkip

	tests := []struct {
		name       string
		kvc        *kvv1.KVCluster
		obs        DeletionObservation
		now        time.Time
		wantAction DeletionActionKind // 0: none
		wantSteps  string             // step=outcome, in order
		wantEvents string             // event reasons, in order
		wantLost   string             // the metric's reason, or ""
		wantDone   bool
		wantErr    bool
		check      func(t *testing.T, p DeletionPass)
	}{
		{name: "first the client Service stops taking connections", kvc: deleted(), obs: ours, now: t0,
			wantAction: DrainClients},
		{name: "clients get their grace", kvc: deleted(), obs: drained,
			now: t0, wantSteps: "Drain=Running", wantEvents: EventDrainStarted},
		{name: "without a Service of its own the drain still waits its grace", kvc: deleted(), obs: with(func(o *DeletionObservation) { o.ClientServiceWritable = false }),
			now: t0, wantSteps: "Drain=Running", wantEvents: EventDrainStarted},
		{name: "then writes are fenced", kvc: deleted(draining), obs: drained, now: t0.Add(11 * time.Second), wantAction: FenceWrites, wantSteps: "Drain=Running"},
		{name: "once fenced, the final backup starts, marked as fenced",
			kvc: deleted(draining), obs: with(func(o *DeletionObservation) { o.DrainedAt, o.Acted.Fenced = &drainedAt, &Fence{Revision: 42} }),
			now: t0.Add(11 * time.Second), wantAction: StartJob, wantSteps: "Drain=Succeeded", wantEvents: EventWritesFenced,
			check: func(t *testing.T, p DeletionPass) {
				if a := p.Action.Job.Annotations[specs.WritesFencedAnnotation]; a != "42" {
					t.Errorf("the final backup Job says writes were fenced at %q, want 42", a)
				}
			}},
		{name: "a fence etcd refuses is tried again", kvc: deleted(draining), obs: with(func(o *DeletionObservation) { o.DrainedAt, o.Acted.Fenced = &drainedAt, &Fence{Err: refused} }),
			now: t0.Add(11 * time.Second), wantSteps: "Drain=Running"},
		{name: "for 30 seconds, then the backup goes on unfenced, with a warning",
			kvc: deleted(draining), obs: with(func(o *DeletionObservation) { o.DrainedAt, o.Acted.Fenced = &drainedAt, &Fence{Err: refused} }),
			now: t0.Add(41 * time.Second), wantAction: StartJob, wantSteps: "Drain=Succeeded", wantEvents: EventWritesNotFenced},
		{name: "the started Job is announced", kvc: deleted(fenced), obs: with(func(o *DeletionObservation) { o.Acted.Started = map[string]error{"kv-final": nil} }),
			now: t0.Add(20 * time.Second), wantSteps: "Drain=Succeeded FinalBackup=Running", wantEvents: EventFinalBackupStarted},
		{name: "a Job the API server refuses is retried within the time limit", kvc: deleted(fenced),
			obs: with(func(o *DeletionObservation) { o.Acted.Started = map[string]error{"kv-final": forbidden} }),
			now: t0.Add(time.Minute), wantSteps: "Drain=Succeeded", wantErr: true},
		{name: "and given up after it, saying what is lost", kvc: deleted(fenced),
			obs: with(func(o *DeletionObservation) { o.Acted.Started = map[string]error{"kv-final": forbidden} }),
			now: t0.Add(11 * time.Minute), wantSteps: "Drain=Succeeded FinalBackup=Failed", wantEvents: ReasonFinalBackupFailed,
			wantLost: "failed", wantDone: true},
		{name: "a finished backup is recorded from its report", kvc: deleted(fenced, step(kvv1.StepFinalBackup, kvv1.DeletionRunning, t0.Add(20*time.Second), 0)),
			obs: with(func(o *DeletionObservation) {
				o.Jobs = finalJob(batchv1.JobComplete, `{"location":"s3://b/ns/kv/uid-kv/kv-final-x.db","size":9,"revision":42}`)
			}),
			now: t0.Add(2 * time.Minute), wantSteps: "Drain=Succeeded FinalBackup=Succeeded", wantEvents: EventFinalBackupCompleted, wantDone: true,
			check: func(t *testing.T, p DeletionPass) {
				if b := p.Status.LastBackup; b == nil || b.Location != "s3://b/ns/kv/uid-kv/kv-final-x.db" || !meta.IsStatusConditionTrue(p.Status.Conditions, kvv1.ConditionBackupSucceeded) {
					t.Errorf("lastBackup %+v, conditions %+v; want the final backup recorded", b, p.Status.Conditions)
				}
			}},
		{name: "a finished backup whose report is not readable yet is waited for", kvc: deleted(fenced, step(kvv1.StepFinalBackup, kvv1.DeletionRunning, t0.Add(20*time.Second), 0)),
			obs: with(func(o *DeletionObservation) { o.Jobs = finalJob(batchv1.JobComplete, "") }),
			now: t0.Add(90 * time.Second), wantSteps: "Drain=Succeeded FinalBackup=Running"},
		{name: "a Job under the name that is someone else's is never taken for ours", kvc: deleted(fenced),
			obs: with(func(o *DeletionObservation) {
				o.Jobs = finalJob(batchv1.JobComplete, "")
				j := o.Jobs["kv-final"]
				j.NotOurs = "not created by this KVCluster"
				o.Jobs["kv-final"] = j
			}),
			now: t0.Add(time.Minute), wantSteps: "Drain=Succeeded FinalBackup=Failed", wantEvents: ReasonFinalBackupFailed, wantLost: "failed", wantDone: true},
		{name: "Block holds a failed final backup, with a condition saying the ways on", kvc: blocking,
			obs: with(func(o *DeletionObservation) { o.Jobs = finalJob(batchv1.JobFailed, "access denied") }),
			now: t0.Add(2 * time.Minute), wantSteps: "Drain=Succeeded FinalBackup=Failed", wantEvents: ReasonFinalBackupFailed,
			check: func(t *testing.T, p DeletionPass) {
				c := meta.FindStatusCondition(p.Status.Conditions, kvv1.ConditionBackupSucceeded)
				if c == nil || c.Reason != ReasonFinalBackupFailed || !strings.Contains(c.Message, kvv1.AnnotationSkipFinalBackup) {
					t.Errorf("condition %+v, want FinalBackupFailed naming the skip annotation", c)
				}
			}},
		{name: "a deleted namespace cannot be protected: the loss is counted as such", kvc: deleted(),
			obs: with(func(o *DeletionObservation) { o.NamespaceGone = true }), now: t0,
			wantSteps: "Drain=Skipped FinalBackup=Failed", wantEvents: ReasonFinalBackupFailed, wantLost: "namespace_deleted", wantDone: true,
			check: func(t *testing.T, p DeletionPass) {
				// It goes with the namespace; the operator may not even be allowed to delete it any
				// more (the Roles of a namespaced install go first).
				if p.DeleteGuard || p.OrphanGuard {
					t.Errorf("delete guard %t, orphan guard %t; want it left to the namespace's deletion", p.DeleteGuard, p.OrphanGuard)
				}
			}},
		{name: "a Job refused by a terminating namespace fails at once", kvc: deleted(fenced),
			obs: with(func(o *DeletionObservation) { o.Acted.Started = map[string]error{"kv-final": terminating} }),
			now: t0.Add(20 * time.Second), wantSteps: "Drain=Succeeded FinalBackup=Failed", wantEvents: ReasonFinalBackupFailed, wantLost: "failed", wantDone: true},
		{name: "--cascade=orphan keeps the members, their data and the guard that owns them", kvc: deleted(),
			obs: with(func(o *DeletionObservation) { o.Orphaning = true }), now: t0,
			wantSteps: "Drain=Skipped FinalBackup=Skipped", wantEvents: EventFinalBackupSkipped, wantLost: "skipped", wantDone: true,
			check: func(t *testing.T, p DeletionPass) {
				if p.DeleteGuard || !p.OrphanGuard {
					t.Errorf("delete guard %t, orphan guard %t; want it kept", p.DeleteGuard, p.OrphanGuard)
				}
			}},
		{name: "a cluster without members of its own has nothing to back up", kvc: deleted(),
			obs: with(func(o *DeletionObservation) { o.OwnMembers = false }), now: t0,
			wantSteps: "Drain=Skipped FinalBackup=Skipped", wantEvents: EventFinalBackupSkipped, wantLost: "skipped", wantDone: true},
		{name: "finalBackup: Skip", kvc: skip, obs: ours, now: t0,
			wantSteps: "FinalBackup=Skipped", wantEvents: EventFinalBackupSkipped, wantLost: "skipped", wantDone: true},
		{name: "what was said is not said again, nor written", kvc: said, obs: drained, now: t0.Add(5 * time.Second), wantSteps: "Drain=Running",
			check: func(t *testing.T, p DeletionPass) {
				if !equality.Semantic.DeepEqual(p.Status, said.Status) {
					t.Errorf("status changed although nothing happened:\n%+v\n%+v", p.Status.Deletion, said.Status.Deletion)
				}
			}},
		{name: "the guard goes once every step is over", kvc: deleted(fenced, step(kvv1.StepFinalBackup, kvv1.DeletionSucceeded, t0, 0)), obs: ours, now: t0.Add(time.Minute),
			wantSteps: "Drain=Succeeded FinalBackup=Succeeded", wantDone: true,
			check: func(t *testing.T, p DeletionPass) {
				if !p.DeleteGuard || p.OrphanGuard {
					t.Errorf("delete guard %t, orphan guard %t; want it deleted", p.DeleteGuard, p.OrphanGuard)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Deletion(tt.kvc, tt.obs, tt.now, Config{Images: specs.Images{Operator: "operator:dev"}})
			var action DeletionActionKind
			if p.Action != nil {
				action = p.Action.Kind
			}
			var steps, events []string
			for _, s := range p.Status.Deletion {
				steps = append(steps, string(s.Name)+"="+string(s.Outcome))
			}
			for _, e := range p.Events {
				events = append(events, e.Reason)
			}
			lost := ""
			if p.Lost != nil {
				lost = p.Lost.Reason
			}
			if action != tt.wantAction || strings.Join(steps, " ") != tt.wantSteps || strings.Join(events, " ") != tt.wantEvents ||
				lost != tt.wantLost || p.Done != tt.wantDone || (p.Err != nil) != tt.wantErr {
				t.Fatalf("action %d, steps %q, events %q, lost %q, done %t, err %v;\nwant action %d, steps %q, events %q, lost %q, done %t, err %t\n%+v",
					action, steps, events, lost, p.Done, p.Err, tt.wantAction, tt.wantSteps, tt.wantEvents, tt.wantLost, tt.wantDone, tt.wantErr, p.Status.Deletion)
			}
			if tt.check != nil {
				tt.check(t, p)
			}
		})
	}
}
