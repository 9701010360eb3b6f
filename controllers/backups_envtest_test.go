package controllers

import (
	"context"
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/backup"
	"github.com/kvcluster/kvcluster-operator/controllers/members/memberstest"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

func withBackups(kvc *kvv1.KVCluster, schedule string) *kvv1.KVCluster {
	kvc.Spec.BackupSchedule = schedule
	kvc.Spec.Backup = &kvv1.BackupSpec{S3: &kvv1.S3Destination{
		Endpoint: "s3.backup.svc:7070", Bucket: "backups", Prefix: "team", Insecure: true, CredentialsSecret: "s3-credentials",
	}}
	return kvc
}

// readyCluster creates a KVCluster and drives it to Ready, as the kubelet and etcd would.
func (h *harness) readyCluster(kvc *kvv1.KVCluster) *kvv1.KVCluster {
	h.t.Helper()
	h.createReady(kvc)
	return h.fresh(kvc)
}

// createReady creates a KVCluster, drives it to Ready and returns the events it gave on the way.
func (h *harness) createReady(kvc *kvv1.KVCluster) string {
	h.t.Helper()
	h.create(kvc)
	// The schedule counts from creationTimestamp (the server's clock, in whole seconds): the fake
	// clock starts at that very second, so no slot can fall between the two clocks.
	h.clock.SetTime(h.fresh(kvc).CreationTimestamp.Time)
	h.members.set(memberstest.Healthy(kvc, int(kvc.Spec.Partitions), "3.7.3"), nil)
	h.reconcile(kvc)
	h.setMembersReady(kvc, kvc.Spec.Partitions)
	h.reconcile(kvc)
	if got := h.fresh(kvc); got.Status.Phase != kvv1.PhaseReady {
		h.t.Fatalf("phase = %s, want Ready", got.Status.Phase)
	}
	return drainEvents(h)
}

// deleteAndReconcile deletes the KVCluster and reconciles through the drain (its clients get
// backup.drainSeconds before writes are fenced and the final backup starts).
func (h *harness) deleteAndReconcile(kvc *kvv1.KVCluster) {
	h.t.Helper()
	if err := h.client.Delete(context.Background(), h.fresh(kvc)); err != nil {
		h.t.Fatal(err)
	}
	h.reconcile(kvc)
	if !h.gone(kvc) {
		h.clock.SetTime(h.clock.Now().Add(11 * time.Second))
		h.reconcile(kvc)
	}
}

// reconcileGone reconciles once and fails unless the KVCluster is then gone and its events hold
// every one of want.
func (h *harness) reconcileGone(kvc *kvv1.KVCluster, want ...string) {
	h.t.Helper()
	h.reconcile(kvc)
	if !h.gone(kvc) {
		h.t.Fatalf("the KVCluster is still there: %+v", h.fresh(kvc).Status.Deletion)
	}
	ev := drainEvents(h)
	for _, w := range want {
		if !strings.Contains(ev, w) {
			h.t.Errorf("events lack %q:\n%s", w, ev)
		}
	}
}

func (h *harness) gone(kvc *kvv1.KVCluster) bool {
	err := h.client.Get(context.Background(), client.ObjectKeyFromObject(kvc), &kvv1.KVCluster{})
	return apierrors.IsNotFound(err)
}

func (h *harness) backupJobs(kvc *kvv1.KVCluster) []batchv1.Job {
	h.t.Helper()
	var jobs batchv1.JobList
	if err := h.client.List(context.Background(), &jobs, client.InNamespace(kvc.Namespace), client.HasLabels{specs.BackupKindLabel}); err != nil {
		h.t.Fatal(err)
	}
	return jobs.Items
}

// finishJob plays the Job controller and the backup pod: the pod's termination message carries
// the backup program's report.
func (h *harness) finishJob(job *batchv1.Job, succeeded bool, report string) {
	h.t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: job.Name + "-" + string(job.UID)[:5], Namespace: job.Namespace,
			Labels:          withLabels(job.Spec.Template.Labels, batchv1.JobNameLabel, job.Name, batchv1.ControllerUidLabel, string(job.UID)),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "backup", Image: "x"}}, RestartPolicy: corev1.RestartPolicyNever},
	}
	if err := h.client.Create(ctx, pod); err != nil {
		h.t.Fatal(err)
	}
	exit := int32(0)
	if !succeeded {
		exit = 1
	}
	pod.Status.Phase = corev1.PodSucceeded
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "backup", State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Message: report}}}}
	if err := h.client.Status().Update(ctx, pod); err != nil {
		h.t.Fatal(err)
	}
	now := metav1.NewTime(h.clock.Now())
	job.Status.StartTime = &now
	if succeeded {
		job.Status.Succeeded = 1
		job.Status.CompletionTime = &now
		job.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	} else {
		job.Status.Failed = 1
		job.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", LastTransitionTime: now},
			{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit", LastTransitionTime: now}}
	}
	if err := h.client.Status().Update(ctx, job); err != nil {
		h.t.Fatalf("finish Job %s: %v", job.Name, err)
	}
}

// backUpSlot plays a slot's backup through: the reconcile 10 s into the slot starts its Job,
// which succeeds 20 s later (not yet recorded).
func (h *harness) backUpSlot(kvc *kvv1.KVCluster, slot time.Time) *batchv1.Job {
	h.t.Helper()
	h.clock.SetTime(slot.Add(10 * time.Second))
	h.reconcile(kvc)
	job := &batchv1.Job{}
	h.get(job, kvc.Namespace, backup.JobName(kvc.Name, slot))
	h.clock.SetTime(slot.Add(30 * time.Second))
	h.finishJob(job, true, successReport("team/"+kvc.Namespace+"/"+kvc.Name+"/"+job.Name+".db"))
	return job
}

func successReport(key string) string {
	out, _ := json.Marshal(backup.Result{Location: "s3://backups/" + key, Size: 20480, SHA256: strings.Repeat("ab", 32), Revision: 42, EtcdVersion: "3.7.3",
		Pruned: []string{"team/old-1.db", "team/old-2.db"}})
	return string(out)
}

func TestScheduledBackupsStartOneJobPerSlotAndRecordSuccessOnly(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("backup")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 3), "*/5 * * * *"))

	// Nothing due right after creation.
	if jobs := h.backupJobs(kvc); len(jobs) != 0 {
		t.Fatalf("jobs before the first slot: %d", len(jobs))
	}
	got := h.fresh(kvc)
	if got.Status.NextBackupTime == nil {
		t.Fatalf("nextBackupTime not set: %+v", got.Status)
	}
	slot := got.Status.NextBackupTime.Time

	// The slot comes: exactly one Job, named for the slot, however often we reconcile, and also
	// after the operator restarts (a new reconciler with no memory).
	h.clock.SetTime(slot.Add(20 * time.Second))
	res := h.reconcile(kvc)
	for range 3 {
		h.reconcile(kvc)
	}
	restarted := newHarness(t)
	restarted.clock.SetTime(slot.Add(40 * time.Second))
	restarted.members.set(memberstest.Healthy(kvc, 3, "3.7.3"), nil)
	restarted.reconcile(kvc)
	jobs := h.backupJobs(kvc)
	if len(jobs) != 1 || jobs[0].Name != backup.JobName("kv", slot) {
		t.Fatalf("jobs = %v, want exactly %s", names(jobs), backup.JobName("kv", slot))
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > 5*time.Minute {
		t.Errorf("requeue after %s, want at most until the next slot", res.RequeueAfter)
	}
	job := jobs[0]
	args := strings.Join(job.Spec.Template.Spec.Containers[0].Args, " ")
	if !strings.Contains(args, "--key=team/"+ns+"/kv/"+string(kvc.UID)+"/"+job.Name+".db") || !strings.Contains(args, "--insecure") {
		t.Errorf("backup Job args = %s", args)
	}
	if ref := metav1.GetControllerOf(&job); ref == nil || ref.Kind != "KVCluster" {
		t.Errorf("backup Job not owned by the KVCluster")
	}
	got = h.fresh(kvc)
	if got.Status.LastScheduledTime == nil || !got.Status.LastScheduledTime.Time.Equal(slot) || got.Status.LastBackupTime != nil {
		t.Errorf("after starting: lastScheduledTime %v, lastBackupTime %v", got.Status.LastScheduledTime, got.Status.LastBackupTime)
	}
	if ev := drainEvents(h); !strings.Contains(ev, "BackupStarted") {
		t.Errorf("events = %q, want BackupStarted", ev)
	}

	// A failed backup does not set lastBackupTime; it says why.
	h.clock.SetTime(slot.Add(time.Minute))
	h.finishJob(&job, false, "backup failed: the store refused the credentials (InvalidAccessKeyId)")
	h.reconcile(kvc)
	got = h.fresh(kvc)
	cond := meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionBackupSucceeded)
	if got.Status.LastBackupTime != nil || cond == nil || cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, "refused the credentials") {
		t.Errorf("after a failure: lastBackupTime %v, condition %+v", got.Status.LastBackupTime, cond)
	}
	if ev := drainEvents(h); !strings.Contains(ev, "Warning BackupFailed") {
		t.Errorf("events = %q, want a Warning BackupFailed", ev)
	}

	// The next slot's backup succeeds: lastBackupTime is its completion, the record has its details.
	next := slot.Add(5 * time.Minute)
	job2 := h.backUpSlot(kvc, next)
	h.reconcile(kvc)
	got = h.fresh(kvc)
	if got.Status.LastBackupTime == nil || !got.Status.LastBackupTime.Time.Equal(next.Add(30*time.Second).Truncate(time.Second)) {
		t.Errorf("lastBackupTime = %v, want %v", got.Status.LastBackupTime, next.Add(30*time.Second))
	}
	lb := got.Status.LastBackup
	if lb == nil || !lb.Succeeded || lb.Job != job2.Name || lb.Revision != 42 || lb.Size != 20480 || lb.Pruned != 2 || !strings.HasPrefix(lb.Location, "s3://backups/team/") {
		t.Errorf("lastBackup = %+v", lb)
	}
	if ev := drainEvents(h); !strings.Contains(ev, "retention deleted 2 older snapshots") {
		t.Errorf("events = %q, want the pruned count", ev)
	}
	if !meta.IsStatusConditionTrue(got.Status.Conditions, kvv1.ConditionBackupSucceeded) {
		t.Errorf("BackupSucceeded = %+v", meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionBackupSucceeded))
	}
	h.assertIdle(kvc, "after recording a backup")
}

func TestOnlyTheMostRecentMissedSlotRunsAndNoneWhileOneRuns(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("missed")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 1), "* * * * *"))
	first := h.fresh(kvc).Status.NextBackupTime.Time

	h.clock.SetTime(first.Add(10 * time.Minute)) // the operator was down for ten slots
	h.reconcile(kvc)
	jobs := h.backupJobs(kvc)
	if len(jobs) != 1 || jobs[0].Name != backup.JobName("kv", first.Add(10*time.Minute)) {
		t.Fatalf("jobs = %v, want only the most recent slot's", names(jobs))
	}
	if ev := drainEvents(h); !strings.Contains(ev, "(10 earlier slots were missed") {
		t.Errorf("events = %q, want the ten missed slots reported", ev)
	}
	h.clock.SetTime(first.Add(12 * time.Minute)) // the Job is still running
	h.reconcile(kvc)
	if jobs := h.backupJobs(kvc); len(jobs) != 1 {
		t.Errorf("a second backup started while one runs: %v", names(jobs))
	}
}

func TestInvalidScheduleIsAConditionAndAnEvent(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("badsched")
	kvc := withBackups(newKVCluster(ns, "kv", 1), "59 23 31 2 *") // passes admission, never fires
	if ev := h.createReady(kvc); strings.Count(ev, plan.ReasonInvalidSchedule) != 1 {
		t.Errorf("events = %q, want one %s warning", ev, plan.ReasonInvalidSchedule)
	}
	got := h.fresh(kvc)
	cond := meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionBackupSucceeded)
	if cond == nil || cond.Reason != plan.ReasonInvalidSchedule || !strings.Contains(cond.Message, "never fires") {
		t.Fatalf("condition = %+v", cond)
	}
	if got.Status.Phase != kvv1.PhaseReady {
		t.Errorf("a bad schedule must not fail the cluster: phase %s", got.Status.Phase)
	}
	h.reconcile(kvc)
	if ev := drainEvents(h); strings.Count(ev, plan.ReasonInvalidSchedule) != 0 {
		t.Errorf("the event repeats on every reconcile: %q", ev)
	}
}

func TestDeletionTakesAFinalBackupBeforeLettingGo(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("final")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 3), ""))
	if !slices.Contains(h.fresh(kvc).Finalizers, kvv1.FinalizerFinalBackup) {
		t.Fatal("the final-backup finalizer was not added")
	}
	h.assertIdle(kvc, "with the finalizer in place")
	h.deleteAndReconcile(kvc)
	job := &batchv1.Job{}
	h.get(job, ns, "kv-final")
	if job.Labels[specs.BackupKindLabel] != specs.BackupFinal {
		t.Errorf("final Job labels = %v", job.Labels)
	}
	h.reconcile(kvc) // still running: the KVCluster stays
	if got := h.fresh(kvc); !slices.Contains(got.Finalizers, kvv1.FinalizerFinalBackup) {
		t.Fatal("the finalizer was removed before the final backup finished")
	}

	h.finishJob(job, true, successReport("team/"+ns+"/kv/kv-final.db"))
	h.reconcileGone(kvc, "FinalBackupCompleted", "kv-final.db")
}

func TestFinalBackupFailsOpenWithAWarning(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("failopen")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 1), ""))
	h.deleteAndReconcile(kvc)
	job := &batchv1.Job{}
	h.get(job, ns, "kv-final")
	h.finishJob(job, false, "backup failed: no etcd member answered")
	h.reconcileGone(kvc, "Warning FinalBackupFailed", "no backup of this cluster exists") // Proceed, saying what is lost
}

func TestFinalBackupBlocksWhenAskedTo(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("block")
	kvc := withBackups(newKVCluster(ns, "kv", 1), "")
	kvc.Spec.Backup.OnFinalBackupFailure = kvv1.FinalBackupBlock
	h.readyCluster(kvc)
	ctx := context.Background()
	h.deleteAndReconcile(kvc)
	job := &batchv1.Job{}
	h.get(job, ns, "kv-final")
	h.finishJob(job, false, "backup failed: bucket \"backups\" does not exist; create it first")
	h.reconcile(kvc)
	got := h.fresh(kvc)
	cond := meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionBackupSucceeded)
	if !slices.Contains(got.Finalizers, kvv1.FinalizerFinalBackup) || cond == nil || cond.Reason != plan.ReasonFinalBackupFailed ||
		!strings.Contains(cond.Message, "does not exist") || !strings.Contains(cond.Message, kvv1.AnnotationSkipFinalBackup) {
		t.Fatalf("Block must keep the KVCluster and say how to proceed: finalizers %v, condition %+v", got.Finalizers, cond)
	}
	if got.Status.LastBackup == nil || got.Status.LastBackup.Job != "kv-final" || got.Status.LastBackup.Succeeded {
		t.Errorf("the failed final backup must be recorded: %+v", got.Status.LastBackup)
	}
	h.assertIdle(kvc, "blocked on a failed final backup")
	// The way out the message names: the annotation.
	got.Annotations = map[string]string{kvv1.AnnotationSkipFinalBackup: "true"}
	if err := h.client.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	h.reconcileGone(kvc)
}

func names(jobs []batchv1.Job) []string {
	var out []string
	for _, j := range jobs {
		out = append(out, j.Name)
	}
	return out
}

// TestEveryBackupRunWritesItsOwnObject: a second upgrade, or a cluster deleted, re-created under
// the same name and deleted again, must never find its backup's object already written (the
// backup would refuse to overwrite it, and the upgrade wait or the final backup be lost).
func TestEveryBackupRunWritesItsOwnObject(t *testing.T) {
	keyOf := func(job *batchv1.Job) string {
		for _, a := range job.Spec.Template.Spec.Containers[0].Args {
			if k, ok := strings.CutPrefix(a, "--key="); ok {
				return k
			}
		}
		t.Fatalf("Job %s has no --key", job.Name)
		return ""
	}

	t.Run("two upgrades in a row", func(t *testing.T) {
		h := newHarness(t)
		ns := h.namespace("twoupgrades")
		kvc := withBackups(newKVCluster(ns, "kv", 3), "")
		sim := h.formedCluster(kvc, "3.6.16")
		var keys []string
		for _, version := range []string{"3.7.3", "3.7.4"} {
			h.setSpec(kvc, func(k *kvv1.KVCluster) { k.Spec.Version = version })
			for i := 0; i < 40 && h.fresh(kvc).Status.CurrentVersion != version; i++ {
				sim.step()
				var job batchv1.Job
				if err := h.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "kv-preupgrade"}, &job); err == nil &&
					job.Annotations[specs.TargetVersionAnnotation] == version && job.Status.Succeeded == 0 {
					keys = append(keys, keyOf(&job))
					h.clock.SetTime(h.clock.Now().Add(time.Minute))
					h.finishJob(&job, true, successReport(keyOf(&job)))
				}
			}
			if got := h.fresh(kvc); got.Status.CurrentVersion != version {
				t.Fatalf("the upgrade to %s did not finish: %+v", version, got.Status)
			}
		}
		if len(keys) != 2 || keys[0] == keys[1] {
			t.Errorf("pre-upgrade backup objects = %q, want two different ones", keys)
		}
	})

	t.Run("delete, re-create and delete again", func(t *testing.T) {
		h := newHarness(t)
		ns := h.namespace("recreate")
		var keys []string
		for range 2 {
			kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 1), ""))
			h.deleteAndReconcile(kvc)
			job := &batchv1.Job{}
			h.get(job, ns, "kv-final")
			keys = append(keys, keyOf(job))
			h.finishJob(job, true, successReport(keyOf(job)))
			h.reconcile(kvc)
			if !h.gone(kvc) {
				t.Fatal("the KVCluster was not released after its final backup")
			}
			h.collectGarbage(ns)
		}
		if keys[0] == keys[1] {
			t.Errorf("both incarnations' final backups write %s: the second would be refused", keys[0])
		}
	})
}

// withLabels is a copy of labels with the given key-value pairs added.
func withLabels(labels map[string]string, kv ...string) map[string]string {
	out := maps.Clone(labels)
	if out == nil {
		out = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// TestBackupNowTakesOneBackupPerToken: kvcluster.io/backup-now=<token> takes one backup through
// the backup Job path, however often the cluster is reconciled and across operator restarts;
// status.backupRequest follows it to its outcome, which a pruned Job does not undo; a Job deleted
// while it ran fails its request, saying so.
func TestBackupNowTakesOneBackupPerToken(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("backupnow")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 1), ""))
	drainEvents(h)

	const token = "2026-12-03T07:00:00Z"
	h.setAnnotation(kvc, kvv1.AnnotationBackupNow, token)
	for range 3 {
		h.reconcile(kvc)
	}
	h.restartOperator()
	h.reconcile(kvc)
	jobs := h.backupJobs(kvc)
	if len(jobs) != 1 || jobs[0].Labels[specs.BackupKindLabel] != specs.BackupOnDemand || jobs[0].Annotations[kvv1.AnnotationBackupNow] != token {
		t.Fatalf("jobs = %v, want exactly one on-demand backup Job for the token", names(jobs))
	}
	job := jobs[0]
	req := h.fresh(kvc).Status.BackupRequest
	if req == nil || req.Token != token || req.State != kvv1.BackupRequestRunning || req.Job != job.Name {
		t.Fatalf("status.backupRequest = %+v, want %s running", req, job.Name)
	}
	if ev := drainEvents(h); strings.Count(ev, "BackupStarted") != 1 || !strings.Contains(ev, token) {
		t.Errorf("events = %q, want one BackupStarted naming the token", ev)
	}

	h.finishJob(&job, true, successReport("team/"+ns+"/kv/"+job.Name+".db"))
	h.reconcile(kvc)
	got := h.fresh(kvc)
	req = got.Status.BackupRequest
	if req.State != kvv1.BackupRequestSucceeded || req.Backup == nil || req.Backup.Revision != 42 || !strings.HasPrefix(req.Backup.Location, "s3://backups/team/") {
		t.Fatalf("status.backupRequest = %+v, want Succeeded with where the backup went", req)
	}
	if got.Status.LastBackup == nil || got.Status.LastBackup.Job != job.Name || got.Status.LastBackupTime == nil {
		t.Errorf("lastBackup %+v, lastBackupTime %v: want the on-demand backup recorded as the last one", got.Status.LastBackup, got.Status.LastBackupTime)
	}
	h.assertIdle(kvc, "after an on-demand backup")

	// Its Job pruned, the same token takes no second backup.
	if err := h.client.Delete(context.Background(), &job, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	h.reconcile(kvc)
	if jobs := h.backupJobs(kvc); len(jobs) != 0 {
		t.Fatalf("the answered token started %v again", names(jobs))
	}
	if req := h.fresh(kvc).Status.BackupRequest; req.State != kvv1.BackupRequestSucceeded {
		t.Errorf("status.backupRequest = %+v after its Job went, want it still Succeeded", req)
	}

	// A new token is a new backup; its Job deleted while it runs fails the request.
	h.setAnnotation(kvc, kvv1.AnnotationBackupNow, "second")
	h.reconcile(kvc)
	second := &batchv1.Job{}
	h.get(second, ns, specs.OnDemandBackupJobName(kvc, "second"))
	if err := h.client.Delete(context.Background(), second, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	drainEvents(h)
	h.reconcile(kvc)
	if req := h.fresh(kvc).Status.BackupRequest; req.Token != "second" || req.State != kvv1.BackupRequestFailed || !strings.Contains(req.Message, "deleted before it finished") {
		t.Errorf("status.backupRequest = %+v, want the request failed because its Job was deleted", req)
	}
	if ev := drainEvents(h); !strings.Contains(ev, "Warning BackupFailed") {
		t.Errorf("events = %q, want a Warning BackupFailed", ev)
	}
	if jobs := h.backupJobs(kvc); len(jobs) != 0 {
		t.Errorf("a failed request started %v again", names(jobs))
	}
}

// cacheBehind reads like the client it wraps, except the KVCluster given, which its next reads
// (as many as behindFor) serve as it was: a cache that has not yet seen the latest writes to it.
type cacheBehind struct {
	client.Client
	kvc       *kvv1.KVCluster
	behindFor int
}

func (c *cacheBehind) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if k, ok := obj.(*kvv1.KVCluster); ok && key == client.ObjectKeyFromObject(c.kvc) && c.behindFor > 0 {
		c.behindFor--
		c.kvc.DeepCopyInto(k)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// The next reconcile may start before the cache holds the status the last one wrote (a child's
// event milliseconds later, as a finished Job's and its pod's are): one that acted on what it
// read would announce the same backup again and write back a status that is behind. It waits
// for the cache instead, and then has nothing left to do.
func TestAReconcileWaitsForTheCacheToHoldTheStatusItWrote(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("behind")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 3), "*/5 * * * *"))
	h.backUpSlot(kvc, h.fresh(kvc).Status.NextBackupTime.Time)
	var before kvv1.KVCluster // as the operator's cache holds it until the next reconcile's write
	if err := h.r.Client.Get(context.Background(), client.ObjectKeyFromObject(kvc), &before); err != nil {
		t.Fatal(err)
	}
	drainEvents(h)
	h.reconcile(kvc)
	if ev := drainEvents(h); strings.Count(ev, plan.ReasonBackupCompleted) != 1 {
		t.Fatalf("events = %q, want BackupCompleted once", ev)
	}

	upToDate := h.r.Client
	for _, tc := range []struct {
		name      string
		behindFor int
		requeue   func(time.Duration) bool
	}{
		{"a cache that does not catch up while the reconcile waits", math.MaxInt,
			func(d time.Duration) bool { return d > 0 && d <= time.Second }}, // a cache catches up in milliseconds
		{"a cache that catches up while the reconcile waits", 3,
			func(d time.Duration) bool { return d >= time.Minute }}, // its next look at a healthy cluster
	} {
		h.r.Client = &cacheBehind{Client: upToDate, kvc: &before, behindFor: tc.behindFor}
		sent := writes.count()
		res := h.reconcile(kvc)
		if n := writes.count() - sent; n != 0 {
			t.Errorf("%s: the reconcile sent %d write requests, want 0: %v", tc.name, n, writes.last(n))
		}
		if ev := drainEvents(h); ev != "" {
			t.Errorf("%s: the reconcile gave events %q, want none", tc.name, ev)
		}
		if !tc.requeue(res.RequeueAfter) {
			t.Errorf("%s: requeue after %s", tc.name, res.RequeueAfter)
		}
	}
	h.r.Client = upToDate
	h.assertIdle(kvc, "once the cache holds the status written")
}
