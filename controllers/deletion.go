package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=delete

// deletionStep is one of the steps taken, in order, before a deleted cluster's members go.
type deletionStep struct {
	name kvv1.DeletionStepName
	// run moves the step on from rec, its record in status, and returns the new record; since is
	// when the step became due (the previous step's end), from which it must start within limit.
	run func(ctx context.Context, d *deletion, rec kvv1.DeletionStep, since time.Time) (kvv1.DeletionStep, error)
	// skipped says why a wanted step is skipped, or "".
	skipped string
}

// deletion is what one pass over the deletion steps works with.
type deletion struct {
	kvc *kvv1.KVCluster
	now time.Time
	// status is the status the pass writes: the steps' records, the final backup's.
	status kvv1.KVClusterStatus
	guard  types.UID
	// blocking: a failed final backup or deregistration holds the deletion (onFinalBackupFailure:
	// Block), except in a namespace being deleted, where nothing can be protected any more.
	blocking, namespaceGone bool
	// orphaning: deleted with --cascade=orphan, the members are meant to keep running.
	orphaning bool
	// ownMembers: this cluster formed, and its StatefulSet is its own. Otherwise whatever answers at
	// its members' names is someone else's: it is neither fenced nor backed up.
	ownMembers bool
}

// orphaning reports a deletion with --cascade=orphan: the API server sets the orphan finalizer,
// and the garbage collector takes the KVCluster off its objects' owners before it removes that
// finalizer; the PodDisruptionBudget (which has no other owner) then stays without it, whereas
// in a background deletion it keeps it and in a foreground one it is deleted.
func (r *KVClusterReconciler) orphaning(ctx context.Context, kvc *kvv1.KVCluster) (bool, error) {
	if slices.Contains(kvc.Finalizers, metav1.FinalizerOrphanDependents) {
		return true, nil
	}
	var pdb policyv1.PodDisruptionBudget
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: kvc.Name}, &pdb); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	return pdb.DeletionTimestamp == nil && !ownedBy(&pdb, kvc.UID), nil
}

// hasOwnMembers: the cluster formed, and its StatefulSet is its own (controlled by it, or, once
// a foreground deletion took the KVCluster off its owners, by its guard).
func (r *KVClusterReconciler) hasOwnMembers(ctx context.Context, kvc *kvv1.KVCluster, guard types.UID) (bool, error) {
	if kvc.Status.CurrentVersion == "" && len(kvc.Status.Members) == 0 {
		return false, nil
	}
	var sts appsv1.StatefulSet
	found, err := r.lookup(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: kvc.Name}, &sts)
	if err != nil || !found {
		return false, err
	}
	return ownedBy(&sts, kvc.UID) || (guard != "" && ownedBy(&sts, guard)), nil
}

// finalize runs while a KVCluster with the finalizer is being deleted. Its members still run (the
// guard keeps them even from a foreground deletion), so it drains the clients and fences writes,
// takes a final backup through the same Job builder and status path as scheduled backups, runs the
// deregistration step, and only then deletes the guard and lets the garbage collector remove the
// rest. Each step's time limit counts from its own start. Unless the user chose Block, a step that
// cannot start, fails or times out is given up with a Warning event saying what was lost, so a
// GitOps prune never hangs; in a namespace being deleted nothing can be protected, and a lost
// final backup is logged and counted in the operator's metrics, which outlive the namespace.
func (r *KVClusterReconciler) finalize(ctx context.Context, cached *kvv1.KVCluster) (ctrl.Result, error) {
	if !slices.Contains(cached.Finalizers, kvv1.FinalizerFinalBackup) {
		return ctrl.Result{}, nil
	}
	// The steps' records are read afresh: a cache lagging behind the last pass's status write would
	// run a step again (drain and fence twice, announce twice).
	kvc := &kvv1.KVCluster{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(cached), kvc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	d := &deletion{kvc: kvc, now: r.Clock.Now(), status: *kvc.Status.DeepCopy()}
	var err error
	if d.namespaceGone, err = r.namespaceTerminating(ctx, kvc.Namespace); err != nil {
		return ctrl.Result{}, err
	}
	d.blocking = plan.BlocksOnFailure(kvc) && !d.namespaceGone
	var guard corev1.ConfigMap
	if found, err := r.lookup(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.GuardName(kvc)}, &guard); err != nil {
		return ctrl.Result{}, err
	} else if found && guard.Labels[specs.ClusterUIDLabel] == string(kvc.UID) {
		d.guard = guard.UID
	}
	if d.orphaning, err = r.orphaning(ctx, kvc); err != nil {
		return ctrl.Result{}, err
	}
	if d.ownMembers, err = r.hasOwnMembers(ctx, kvc, d.guard); err != nil {
		return ctrl.Result{}, err
	}

	since := kvc.DeletionTimestamp.Time
	for _, step := range r.deletionSteps(d) {
		before, _ := findStep(kvc.Status.Deletion, step.name)
		rec := before
		rec.Name = step.name
		switch {
		case step.skipped != "" && rec.Outcome == kvv1.DeletionSkipped && rec.Message == step.skipped: // said already
		case step.skipped != "":
			end := metav1.NewTime(d.now.Truncate(time.Second)) // the next step's time limit counts from here
			rec = kvv1.DeletionStep{Name: step.name, Outcome: kvv1.DeletionSkipped, CompletionTime: &end, Message: step.skipped}
		case !d.done(rec):
			if rec, err = step.run(ctx, d, rec, since); err != nil {
				// What the earlier steps did is kept (a fence is not raised twice); this one is retried.
				return ctrl.Result{}, errors.Join(err, r.applyDeletionStatus(ctx, d))
			}
		}
		setStep(&d.status.Deletion, rec)
		if rec.Outcome == kvv1.DeletionFailed && d.blocking {
			plan.SetCondition(&d.status, kvc, kvv1.ConditionBackupSucceeded, false, plan.ReasonFinalBackupFailed, blockedMessage(rec), d.now)
		}
		r.announceStep(ctx, d, before, rec)
		if !d.done(rec) {
			return ctrl.Result{RequeueAfter: 5 * time.Second}, r.applyDeletionStatus(ctx, d)
		}
		if rec.CompletionTime != nil {
			since = rec.CompletionTime.Time
		}
	}
	if err := r.applyDeletionStatus(ctx, d); err != nil {
		return ctrl.Result{}, err
	}
	if d.orphaning {
		// Deleted with --cascade=orphan, the members are meant to stay: the guard keeps owning them.
		if d.guard != "" {
			orphaned := specs.Guard(kvc).WithAnnotations(map[string]string{specs.OrphanedAnnotation: "true"})
			if err := r.Client.Apply(ctx, orphaned, client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
				return ctrl.Result{}, fmt.Errorf("keep the deletion guard of orphaned members: %w", err)
			}
		}
	} else if err := r.deleteGuard(ctx, kvc.Namespace, kvc.Name, kvc.UID); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, r.applyFinalizer(ctx, kvc, false)
}

// done: the step needs nothing more. A failure is final unless the deletion blocks on it.
func (d *deletion) done(rec kvv1.DeletionStep) bool {
	switch rec.Outcome {
	case kvv1.DeletionSucceeded, kvv1.DeletionSkipped:
		return true
	case kvv1.DeletionFailed:
		return !d.blocking
	}
	return false
}

func (r *KVClusterReconciler) applyDeletionStatus(ctx context.Context, d *deletion) error {
	// The status is recorded while the object still exists (a no-op when nothing changed).
	return applyStatus(ctx, r.Client, d.kvc, d.status)
}

// deletionSteps are the steps of this cluster's deletion, in order: drain the clients and fence
// writes, take the final backup, deregister.
func (r *KVClusterReconciler) deletionSteps(d *deletion) []deletionStep {
	kvc := d.kvc
	var steps []deletionStep
	if kvc.Spec.Backup != nil && !plan.WantsFinalBackup(kvc) {
		steps = append(steps, deletionStep{name: kvv1.StepFinalBackup, skipped: "finalBackup: Skip"})
	}
	if plan.WantsFinalBackup(kvc) {
		skipped, skipDrain := "", ""
		switch {
		case d.orphaning:
			skipped = "deleted with --cascade=orphan: the members keep running, with their data"
			skipDrain = skipped
		case d.namespaceGone: // its members may be gone already: the loss is the namespace's deletion
			skipDrain = "the namespace is being deleted: no final backup can be taken"
		case !d.ownMembers:
			skipped = "the cluster has no members of its own (it never formed, or its StatefulSet is missing or someone else's): there is nothing to back up"
			skipDrain = skipped
		case plan.SkipsFinalBackup(kvc):
			skipped = "annotation " + kvv1.AnnotationSkipFinalBackup + "=true"
			skipDrain = skipped
		}
		steps = append(steps,
			deletionStep{name: kvv1.StepDrain, run: r.drain, skipped: skipDrain},
			deletionStep{name: kvv1.StepFinalBackup, run: r.jobStep(specs.FinalBackupJobName(kvc), time.Duration(kvc.Spec.Backup.FinalBackupTimeoutSeconds)*time.Second,
				func(d *deletion) *batchv1ac.JobApplyConfiguration {
					run := specs.FinalBackupRun(kvc, d.now)
					run.Guard = d.guard
					if drain, ok := findStep(d.status.Deletion, kvv1.StepDrain); ok && drain.Revision > 0 {
						run.Annotations = map[string]string{specs.WritesFencedAnnotation: strconv.FormatInt(drain.Revision, 10)}
					}
					return specs.BackupJob(kvc, run, r.BackupImage)
				}), skipped: skipped})
	}
	if kvc.Spec.Deregistration != nil {
		skipped := ""
		if d.orphaning {
			skipped = "deleted with --cascade=orphan: the members keep running"
		}
		steps = append(steps, deletionStep{name: kvv1.StepDeregistration, skipped: skipped,
			run: r.jobStep(specs.DeregistrationJobName(kvc), time.Duration(kvc.Spec.Deregistration.TimeoutSeconds)*time.Second,
				func(d *deletion) *batchv1ac.JobApplyConfiguration {
					return specs.DeregistrationJob(kvc, r.BackupImage, d.guard)
				})})
	}
	return steps
}

// fenceRetries is how long a fence etcd refuses is tried again before the final backup goes on
// without it.
const fenceRetries = 30 * time.Second

// drain stops new client connections (the client Service selects no member), gives clients
// backup.drainSeconds, then fences writes, so the final backup holds the cluster's last state.
// The drain's start is kept on the client Service, written before anything else.
func (r *KVClusterReconciler) drain(ctx context.Context, d *deletion, rec kvv1.DeletionStep, _ time.Time) (kvv1.DeletionStep, error) {
	kvc := d.kvc
	grace := time.Duration(ptr.Deref(kvc.Spec.Backup.DrainSeconds, 10)) * time.Second
	var svc corev1.Service
	found, err := r.lookup(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.ClientServiceName(kvc)}, &svc)
	if err != nil {
		return rec, err
	}
	since := rec.StartTime
	if at, err := time.Parse(time.RFC3339, svc.Annotations[specs.DrainedAtAnnotation]); found && err == nil {
		since = &metav1.Time{Time: at}
	}
	if since == nil {
		now := metav1.NewTime(d.now.Truncate(time.Second))
		if found && controlledBy(&svc, kvc) && svc.DeletionTimestamp == nil { // else no one reaches the members through it
			if err := r.Client.Apply(ctx, specs.ClientService(kvc, now.Time), client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
				return rec, fmt.Errorf("drain the client Service %s/%s: %w", kvc.Namespace, svc.Name, err)
			}
		}
		since = &now
	}
	rec.StartTime = since
	if d.now.Before(since.Add(grace)) {
		rec.Outcome, rec.Message = kvv1.DeletionRunning, fmt.Sprintf(
			"the client Service takes no new connections; clients have %s to finish before writes are fenced", grace)
		return rec, nil
	}
	revision, err := r.Members.FenceWrites(ctx, specs.MemberClientURLs(kvc))
	if err != nil && d.now.Before(since.Add(grace+fenceRetries)) {
		rec.Outcome, rec.Message = kvv1.DeletionRunning, "fencing writes failed, retrying: "+err.Error()
		return rec, nil
	}
	end := metav1.NewTime(d.now.Truncate(time.Second))
	rec.Outcome, rec.CompletionTime = kvv1.DeletionSucceeded, &end
	if err != nil {
		rec.Message = "writes are not fenced (" + err.Error() + "): writes acknowledged after the final backup began are not in it"
		return rec, nil
	}
	rec.Revision, rec.Message = revision, fmt.Sprintf("clients drained for %s; writes fenced at revision %d", grace, revision)
	return rec, nil
}

// jobStep runs a step as one Job. Its time limit counts from its own start: it must start within
// limit of the previous step's end, and finish within limit of its Job's creation.
func (r *KVClusterReconciler) jobStep(name string, limit time.Duration, build func(d *deletion) *batchv1ac.JobApplyConfiguration) func(
	context.Context, *deletion, kvv1.DeletionStep, time.Time) (kvv1.DeletionStep, error) {
	return func(ctx context.Context, d *deletion, rec kvv1.DeletionStep, since time.Time) (kvv1.DeletionStep, error) {
		kvc := d.kvc
		fail := func(why string) (kvv1.DeletionStep, error) {
			end := metav1.NewTime(d.now.Truncate(time.Second))
			return kvv1.DeletionStep{Name: rec.Name, Outcome: kvv1.DeletionFailed, Job: rec.Job, StartTime: rec.StartTime, CompletionTime: &end, Message: why}, nil
		}
		job := &batchv1.Job{}
		found, err := r.lookup(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: name}, job)
		if err != nil {
			return rec, err
		}
		// A foreground deletion takes the KVCluster off the owners of its guarded Jobs: the cluster's
		// UID label still says whose they are.
		if found && !controlledBy(job, kvc) && job.Labels[specs.ClusterUIDLabel] != string(kvc.UID) {
			return fail(fmt.Sprintf("a Job named %s exists and is not this KVCluster's (%s)", name, ownerOf(job)))
		}
		if !found { // not started yet, or (blocking) a person deleted the failed Job to retry
			if d.namespaceGone {
				return fail("its namespace is being deleted, so no Job can start there")
			}
			err := r.Client.Apply(ctx, build(d), client.FieldOwner(specs.FieldManager), client.ForceOwnership)
			if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				return fail("its namespace is being deleted, so no Job can start there")
			}
			if err != nil && !d.blocking && d.now.Sub(since) > limit { // given up only after trying
				return fail(fmt.Sprintf("it could not start within %s: %v", limit, err))
			}
			if err != nil {
				return rec, fmt.Errorf("apply Job %s/%s: %w", kvc.Namespace, name, err)
			}
			start := metav1.NewTime(d.now.Truncate(time.Second))
			return kvv1.DeletionStep{Name: rec.Name, Outcome: kvv1.DeletionRunning, Job: name, StartTime: &start, Message: "started Job " + name}, nil
		}
		if rec.Job != name || rec.StartTime == nil { // the record was lost: the Job says when the step began
			rec.Job, rec.StartTime = name, &job.CreationTimestamp
		}
		if rec.Outcome != kvv1.DeletionRunning { // a Job started again after a failure (Block)
			rec.Outcome, rec.CompletionTime, rec.Message = kvv1.DeletionRunning, nil, "started Job "+name
		}
		j := plan.NewJob(job, "")
		done, succeeded, finishedAt := j.Done, j.Succeeded, j.FinishedAt
		if !done {
			if !d.blocking && d.now.Sub(rec.StartTime.Time) > limit+time.Minute {
				// The Job's own deadline should have ended it; do not wait for ever if it did not.
				return fail(fmt.Sprintf("it did not finish within %s", limit))
			}
			return rec, nil
		}
		report, err := r.jobReport(ctx, job, true)
		if err != nil {
			return rec, err
		}
		if succeeded && report == "" && rec.Name == kvv1.StepFinalBackup && d.now.Sub(finishedAt) < time.Minute {
			return rec, nil // its report (where it wrote, at which revision) is not readable yet
		}
		end := metav1.NewTime(finishedAt.Truncate(time.Second))
		rec.CompletionTime = &end
		if rec.Name == kvv1.StepFinalBackup {
			j.Report = report
			plan.RecordFinishedBackups(&d.status, kvc, []plan.Job{j})
			report = d.status.LastBackup.Message
			if succeeded {
				b := d.status.LastBackup
				report = fmt.Sprintf("wrote %s (%d bytes, revision %d)", b.Location, b.Size, b.Revision)
			}
		} else if report == "" && !succeeded {
			report = plan.JobFailureMessage(job)
		}
		if rec.Outcome, rec.Message = kvv1.DeletionSucceeded, report; !succeeded {
			rec.Outcome, rec.Message = kvv1.DeletionFailed, "it failed: "+report
		}
		return rec, nil
	}
}

// announceStep says what changed in a step, once: events, and for a final backup given up, the
// operator's log and metrics (they outlive a deleted namespace, where events cannot be written).
func (r *KVClusterReconciler) announceStep(ctx context.Context, d *deletion, before, after kvv1.DeletionStep) {
	if before.Outcome == after.Outcome && before.Job == after.Job && before.Message == after.Message {
		return
	}
	kvc, what := d.kvc, stepNoun(after.Name)
	normal := func(reason, format string, args ...any) {
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, reason, "Delete", format, args...)
	}
	switch after.Outcome {
	case kvv1.DeletionRunning:
		if before.Outcome == kvv1.DeletionRunning && before.Job == after.Job {
			return // still running
		}
		if after.Name == kvv1.StepDrain {
			normal(plan.EventDrainStarted, "%s", after.Message)
			return
		}
		normal(plan.StepEvent(after.Name, after.Outcome), "started the %s Job %s before deleting the cluster", what, after.Job)
	case kvv1.DeletionSucceeded:
		switch after.Name {
		case kvv1.StepDrain:
			if after.Revision == 0 {
				r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, plan.EventWritesNotFenced, "Delete", "%s", after.Message)
				return
			}
			normal(plan.EventWritesFenced, "%s", after.Message)
		case kvv1.StepFinalBackup:
			fenced := "writes were not fenced"
			if drain, _ := findStep(d.status.Deletion, kvv1.StepDrain); drain.Revision > 0 {
				fenced = fmt.Sprintf("writes were fenced at revision %d: it holds the cluster's last state", drain.Revision)
			}
			normal(plan.EventFinalBackupCompleted, "final backup %s %s; %s; deleting the cluster", after.Job, after.Message, fenced)
		default:
			normal(plan.StepEvent(after.Name, after.Outcome), "%s Job %s succeeded: %s", what, after.Job, after.Message)
		}
	case kvv1.DeletionSkipped:
		if after.Name == kvv1.StepFinalBackup {
			r.finalBackupLost(ctx, d, "skipped", plan.EventFinalBackupSkipped, "deleting without a final backup ("+after.Message+")")
		}
	case kvv1.DeletionFailed:
		if d.blocking {
			r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, plan.ReasonFinalBackupFailed, "Delete", "%s", blockedMessage(after))
			return
		}
		why := "deleting without the " + what + " because " + after.Message
		if after.Name == kvv1.StepFinalBackup {
			reason := "failed"
			if d.namespaceGone {
				reason = "namespace_deleted"
			}
			r.finalBackupLost(ctx, d, reason, plan.ReasonFinalBackupFailed, why)
			return
		}
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, plan.StepEvent(after.Name, after.Outcome), "Delete",
			"%s; the cluster may still be registered where the step would have removed it", why)
	}
}

// finalBackupLost says loudly that a cluster goes without its final backup, and what is lost.
func (r *KVClusterReconciler) finalBackupLost(ctx context.Context, d *deletion, reason, eventReason, why string) {
	lost := lastBackupSentence(d.kvc)
	finalBackupsLost.WithLabelValues(reason).Inc()
	log.FromContext(ctx).Error(nil, "a KVCluster is deleted without its final backup", "why", why, "lost", lost, "reason", reason)
	r.Recorder.Eventf(d.kvc, nil, corev1.EventTypeWarning, eventReason, "Delete", "%s; %s", why, lost)
}

// blockedMessage says why a deletion is held, and the ways on.
func blockedMessage(rec kvv1.DeletionStep) string {
	return fmt.Sprintf("the %s did not succeed: %s. Deletion is blocked (onFinalBackupFailure: Block); fix the cause and delete "+
		"the failed Job to retry, or annotate %s=true to delete without it", stepNoun(rec.Name), rec.Message, kvv1.AnnotationSkipFinalBackup)
}

// namespaceTerminating: the cluster's namespace is being deleted, so its pods and claims are going
// and no Job can start there.
func (r *KVClusterReconciler) namespaceTerminating(ctx context.Context, name string) (bool, error) {
	var ns corev1.Namespace
	if err := r.APIReader.Get(ctx, client.ObjectKey{Name: name}, &ns); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return ns.DeletionTimestamp != nil, nil
}

func stepNoun(name kvv1.DeletionStepName) string {
	switch name {
	case kvv1.StepFinalBackup:
		return "final backup"
	case kvv1.StepDeregistration:
		return "deregistration"
	}
	return "drain"
}

func findStep(steps []kvv1.DeletionStep, name kvv1.DeletionStepName) (kvv1.DeletionStep, bool) {
	for _, s := range steps {
		if s.Name == name {
			return s, true
		}
	}
	return kvv1.DeletionStep{}, false
}

func setStep(steps *[]kvv1.DeletionStep, rec kvv1.DeletionStep) {
	for i := range *steps {
		if (*steps)[i].Name == rec.Name {
			(*steps)[i] = rec
			return
		}
	}
	*steps = append(*steps, rec)
}

// lastBackupSentence says what a deletion without a final backup loses.
func lastBackupSentence(kvc *kvv1.KVCluster) string {
	if kvc.Status.LastBackupTime == nil {
		return "no backup of this cluster exists: its data is lost"
	}
	loc := ""
	if kvc.Status.LastBackup != nil && kvc.Status.LastBackup.Succeeded {
		loc = " at " + kvc.Status.LastBackup.Location
	}
	return fmt.Sprintf("writes after the last successful backup%s (%s) are lost", loc, kvc.Status.LastBackupTime.UTC().Format(time.RFC3339))
}
