package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1ac "github.com/kvcluster/kvcluster-operator/apis/applyconfiguration/apis/v1alpha1"
	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// wantsFinalBackup: a destination is configured and the policy is not Skip.
func wantsFinalBackup(kvc *kvv1.KVCluster) bool {
	return kvc.Spec.Backup != nil && kvc.Spec.Backup.FinalBackup != kvv1.FinalBackupSkip
}

// wantsFinalizer: some step must run on deletion before the members go.
func wantsFinalizer(kvc *kvv1.KVCluster) bool {
	return wantsFinalBackup(kvc) || kvc.Spec.Deregistration != nil
}

// blocksOnFailure: the user chose to keep the KVCluster rather than lose a deletion step.
func blocksOnFailure(kvc *kvv1.KVCluster) bool {
	return kvc.Spec.Backup != nil && kvc.Spec.Backup.OnFinalBackupFailure == kvv1.FinalBackupBlock &&
		kvc.Annotations[kvv1.AnnotationSkipFinalBackup] != "true"
}

// syncFinalizer owns the finalizer exactly while a deletion step is wanted. It is applied to
// metadata only (the operator never writes the spec), with the UID so a KVCluster deleted
// meanwhile is never re-created.
func (r *KVClusterReconciler) syncFinalizer(ctx context.Context, kvc *kvv1.KVCluster) error {
	has := slices.Contains(kvc.Finalizers, kvv1.FinalizerFinalBackup)
	if has == wantsFinalizer(kvc) {
		return nil
	}
	return r.applyFinalizer(ctx, kvc, !has)
}

func (r *KVClusterReconciler) applyFinalizer(ctx context.Context, kvc *kvv1.KVCluster, present bool) error {
	ac := kvv1ac.KVCluster(kvc.Name, kvc.Namespace).WithUID(kvc.UID)
	if present {
		ac.WithFinalizers(kvv1.FinalizerFinalBackup)
	}
	if err := r.Client.Apply(ctx, ac, client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
		if !present && apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("apply finalizer of KVCluster %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	return nil
}

// stepOutcome is where a deletion step stands.
type stepOutcome int

const (
	stepRunning stepOutcome = iota // look again later
	stepDone                       // succeeded, skipped, or failed open: go on
)

// finalize runs while a KVCluster with the finalizer is being deleted. Its members still run
// (their owner still exists), so it takes a final backup, through the same Job builder and status
// path as scheduled backups, then runs the deregistration step, and only then lets the deletion
// go on. Unless the user chose Block, a step that cannot start (the namespace is being deleted),
// fails or times out is given up with a Warning event saying what was lost, so a namespace
// teardown or GitOps prune never hangs for ever.
func (r *KVClusterReconciler) finalize(ctx context.Context, kvc *kvv1.KVCluster) (ctrl.Result, error) {
	if !slices.Contains(kvc.Finalizers, kvv1.FinalizerFinalBackup) {
		return ctrl.Result{}, nil
	}
	for _, step := range []func(context.Context, *kvv1.KVCluster) (stepOutcome, error){r.finalBackupStep, r.deregistrationStep} {
		outcome, err := step(ctx, kvc)
		if err != nil {
			return ctrl.Result{}, err
		}
		if outcome == stepRunning {
			return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
		}
	}
	return ctrl.Result{}, r.applyFinalizer(ctx, kvc, false)
}

// announceOnce emits a deletion-step event only before the next step began, so a step that is
// already over is not announced again while a later one runs.
func (r *KVClusterReconciler) announceOnce(ctx context.Context, kvc *kvv1.KVCluster, eventType, reason, format string, args ...any) {
	var job batchv1.Job
	if kvc.Spec.Deregistration != nil && r.Client.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.DeregistrationJobName(kvc)}, &job) == nil {
		return
	}
	r.Recorder.Eventf(kvc, nil, eventType, reason, "Delete", format, args...)
}

func (r *KVClusterReconciler) finalBackupStep(ctx context.Context, kvc *kvv1.KVCluster) (stepOutcome, error) {
	if !wantsFinalBackup(kvc) || kvc.Annotations[kvv1.AnnotationSkipFinalBackup] == "true" {
		if kvc.Spec.Backup != nil { // a configured backup that is skipped is worth a warning
			r.announceOnce(ctx, kvc, corev1.EventTypeWarning, "FinalBackupSkipped",
				"deleting without a final backup (%s); %s", skipReason(kvc), lastBackupSentence(kvc))
		}
		return stepDone, nil
	}
	b := kvc.Spec.Backup
	timeout := time.Duration(b.FinalBackupTimeoutSeconds) * time.Second
	name := specs.FinalBackupJobName(kvc)
	job, found, started, err := r.runDeletionJob(ctx, kvc, name, timeout, specs.BackupJob(kvc, specs.FinalBackupRun(kvc, r.Clock.Now()), r.BackupImage))
	if errors.Is(err, errCannotStart) {
		return r.giveUp(ctx, kvc, kvc.Status, "final backup", err.Error())
	}
	if err != nil {
		return stepRunning, err
	}
	if started { // said before anything else: the cache may not show the new Job yet
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, "FinalBackupStarted", "Delete", "started the final backup %s before deleting the cluster", name)
	}
	if !found {
		return stepRunning, nil
	}
	done, succeeded, finishedAt := jobOutcome(job)
	if !done {
		if !blocksOnFailure(kvc) && r.Clock.Now().Sub(kvc.DeletionTimestamp.Time) > timeout+time.Minute {
			// The Job's own deadline should have ended it; do not wait for ever if it did not.
			return r.giveUp(ctx, kvc, kvc.Status, "final backup", fmt.Sprintf("it did not finish within %s", timeout))
		}
		return stepRunning, nil
	}
	report, err := r.jobReport(ctx, job)
	if err != nil {
		return stepRunning, err
	}
	st := *kvc.Status.DeepCopy()
	rec, isNew := recordFinishedBackups(&st, []backupJob{{job: job, done: done, succeeded: succeeded, finishedAt: finishedAt, report: report}}, kvc.Generation)
	if !succeeded {
		return r.giveUp(ctx, kvc, st, "final backup", "it failed: "+rec.Message)
	}
	if err := applyStatus(ctx, r.Client, kvc, st); err != nil {
		return stepRunning, err
	}
	if isNew {
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, "FinalBackupCompleted", "Delete",
			"final backup %s wrote %s (%d bytes, revision %d); deleting the cluster", rec.Job, rec.Location, rec.Size, rec.Revision)
	}
	return stepDone, nil
}

func (r *KVClusterReconciler) deregistrationStep(ctx context.Context, kvc *kvv1.KVCluster) (stepOutcome, error) {
	d := kvc.Spec.Deregistration
	if d == nil {
		return stepDone, nil
	}
	timeout := time.Duration(d.TimeoutSeconds) * time.Second
	name := specs.DeregistrationJobName(kvc)
	job, found, started, err := r.runDeletionJob(ctx, kvc, name, timeout, specs.DeregistrationJob(kvc, r.BackupImage))
	if errors.Is(err, errCannotStart) {
		return r.giveUp(ctx, kvc, kvc.Status, "deregistration", err.Error())
	}
	if err != nil {
		return stepRunning, err
	}
	if started { // said before anything else: the cache may not show the new Job yet
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, "DeregistrationStarted", "Delete", "started the deregistration Job %s", name)
	}
	if started || !found {
		return stepRunning, nil
	}
	done, succeeded, _ := jobOutcome(job)
	if !done {
		if !blocksOnFailure(kvc) && r.Clock.Now().Sub(kvc.DeletionTimestamp.Time) > timeout+time.Minute {
			return r.giveUp(ctx, kvc, kvc.Status, "deregistration", fmt.Sprintf("it did not finish within %s", timeout))
		}
		return stepRunning, nil
	}
	report, err := r.jobReport(ctx, job)
	if err != nil {
		return stepRunning, err
	}
	if !succeeded {
		if report == "" {
			report = jobFailureMessage(job)
		}
		return r.giveUp(ctx, kvc, kvc.Status, "deregistration", "it failed: "+report)
	}
	r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, "DeregistrationSucceeded", "Delete", "deregistration Job %s succeeded: %s", name, report)
	return stepDone, nil
}

// errCannotStart means a deletion step's Job cannot be created, now or ever.
var errCannotStart = errors.New("cannot start")

// runDeletionJob gets the step's Job, creating it when it does not exist yet. started is true when
// this call created it; found is false when there is no Job to look at yet (a Job just created may
// not be in the cache).
func (r *KVClusterReconciler) runDeletionJob(ctx context.Context, kvc *kvv1.KVCluster, name string, timeout time.Duration,
	desired *batchv1ac.JobApplyConfiguration) (job *batchv1.Job, found, started bool, err error) {
	job = &batchv1.Job{}
	err = r.Client.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: name}, job)
	if err == nil {
		return job, true, false, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, false, false, fmt.Errorf("get Job %s/%s: %w", kvc.Namespace, name, err)
	}
	// With Block, a person deletes a failed Job to retry, whenever that is.
	if !blocksOnFailure(kvc) && r.Clock.Now().Sub(kvc.DeletionTimestamp.Time) > timeout {
		return nil, false, false, fmt.Errorf("%w: it could not start within %s", errCannotStart, timeout)
	}
	err = r.Client.Apply(ctx, desired, client.FieldOwner(specs.FieldManager), client.ForceOwnership)
	if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		return nil, false, false, fmt.Errorf("%w: its namespace is being deleted, so no Job can start there", errCannotStart)
	}
	if err != nil {
		return nil, false, false, fmt.Errorf("apply Job %s/%s: %w", kvc.Namespace, name, err)
	}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: name}, job); err != nil {
		return nil, false, true, nil // created; the cache has not seen it yet
	}
	return job, true, true, nil
}

// giveUp ends a failed deletion step: fail open (the default) with a Warning event saying what is
// lost, or keep blocking (onFinalBackupFailure: Block) with a condition that says how to go on.
// st is the status the step computed (e.g. with the failed backup recorded); it is applied as
// one whole, so a blocked cluster's status does not change between reconciles.
func (r *KVClusterReconciler) giveUp(ctx context.Context, kvc *kvv1.KVCluster, st kvv1.KVClusterStatus, step, why string) (stepOutcome, error) {
	st = *st.DeepCopy()
	lost := lastBackupSentence(kvc)
	if step == "deregistration" {
		lost = "the cluster may still be registered where the step would have removed it"
	}
	if blocksOnFailure(kvc) {
		msg := fmt.Sprintf("the %s did not succeed: %s. Deletion is blocked (onFinalBackupFailure: Block); "+
			"fix the cause and delete the failed Job to retry, or annotate %s=true to delete without it", step, why, kvv1.AnnotationSkipFinalBackup)
		prev := meta.FindStatusCondition(kvc.Status.Conditions, kvv1.ConditionBackupSucceeded)
		if prev == nil || prev.Reason != ReasonFinalBackupFailed {
			r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, ReasonFinalBackupFailed, "Delete", "%s", msg)
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: kvv1.ConditionBackupSucceeded, Status: metav1.ConditionFalse,
			Reason: ReasonFinalBackupFailed, Message: msg, ObservedGeneration: kvc.Generation, LastTransitionTime: metav1.NewTime(r.Clock.Now().Truncate(time.Second))})
		return stepRunning, applyStatus(ctx, r.Client, kvc, st)
	}
	// The outcome is recorded while the object still exists (a no-op when nothing changed).
	if err := applyStatus(ctx, r.Client, kvc, st); err != nil {
		return stepRunning, err
	}
	if step == "deregistration" { // the last step: the finalizer goes right after, so it is said once
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, "DeregistrationFailed", "Delete", "deleting without the %s because %s; %s", step, why, lost)
		return stepDone, nil
	}
	r.announceOnce(ctx, kvc, corev1.EventTypeWarning, ReasonFinalBackupFailed, "deleting without the %s because %s; %s", step, why, lost)
	return stepDone, nil
}

func skipReason(kvc *kvv1.KVCluster) string {
	if kvc.Annotations[kvv1.AnnotationSkipFinalBackup] == "true" {
		return "annotation " + kvv1.AnnotationSkipFinalBackup + "=true"
	}
	return "finalBackup: Skip"
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
