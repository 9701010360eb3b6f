package controllers

import (
	"context"
	"fmt"
	"slices"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// syncFinalizer owns the final-backup finalizer exactly while a final backup is wanted. It is
// applied to metadata only (the operator never writes the spec), with the UID so a KVCluster
// deleted meanwhile is never re-created.
func (r *KVClusterReconciler) syncFinalizer(ctx context.Context, kvc *kvv1.KVCluster) error {
	has := slices.Contains(kvc.Finalizers, kvv1.FinalizerFinalBackup)
	if has == wantsFinalBackup(kvc) {
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

// finalBackup runs while a KVCluster with the finalizer is being deleted: its members still run
// (their owner still exists), so it takes one last backup through the same Job builder and status
// path as scheduled backups, waits for it, records it, and then lets the deletion go on. Unless
// the user chose Block, it fails open — a Warning event says what was lost — when the Job cannot
// start or fails or times out, so a namespace teardown or GitOps prune never hangs for ever.
func (r *KVClusterReconciler) finalBackup(ctx context.Context, kvc *kvv1.KVCluster) (ctrl.Result, error) {
	if !slices.Contains(kvc.Finalizers, kvv1.FinalizerFinalBackup) {
		return ctrl.Result{}, nil
	}
	now := r.Clock.Now()
	if !wantsFinalBackup(kvc) || kvc.Annotations[kvv1.AnnotationSkipFinalBackup] == "true" {
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, "FinalBackupSkipped", "FinalBackup",
			"deleting without a final backup (%s); %s", skipReason(kvc), lastBackupSentence(kvc))
		return ctrl.Result{}, r.applyFinalizer(ctx, kvc, false)
	}
	b := kvc.Spec.Backup
	timeout := time.Duration(b.FinalBackupTimeoutSeconds) * time.Second
	name := specs.FinalBackupJobName(kvc)

	var job batchv1.Job
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: name}, &job)
	if apierrors.IsNotFound(err) {
		// With Block, a person deletes a failed Job to retry, whenever that is.
		if b.OnFinalBackupFailure != kvv1.FinalBackupBlock && now.Sub(kvc.DeletionTimestamp.Time) > timeout {
			return r.giveUpFinalBackup(ctx, kvc, fmt.Sprintf("it could not start within %s", timeout))
		}
		err = r.Client.Apply(ctx, specs.BackupJob(kvc, name, specs.BackupFinal, r.BackupImage), client.FieldOwner(specs.FieldManager), client.ForceOwnership)
		if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return r.giveUpFinalBackup(ctx, kvc, "its namespace is being deleted, so no Job can start there")
		}
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("apply final backup Job %s/%s: %w", kvc.Namespace, name, err)
		}
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, "FinalBackupStarted", "FinalBackup", "started the final backup %s before deleting the cluster", name)
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("get final backup Job %s/%s: %w", kvc.Namespace, name, err)
	}

	done, succeeded, finishedAt := jobOutcome(&job)
	if !done {
		if b.OnFinalBackupFailure != kvv1.FinalBackupBlock && now.Sub(kvc.DeletionTimestamp.Time) > timeout+time.Minute {
			// The Job's own deadline should have ended it; do not wait for ever if it did not.
			return r.giveUpFinalBackup(ctx, kvc, fmt.Sprintf("it did not finish within %s", timeout))
		}
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
	}
	report, err := r.jobReport(ctx, &job)
	if err != nil {
		return ctrl.Result{}, err
	}
	st := *kvc.Status.DeepCopy()
	rec, _ := recordFinishedBackups(&st, []backupJob{{job: &job, done: done, succeeded: succeeded, finishedAt: finishedAt, report: report}}, kvc.Generation)
	if !succeeded {
		if err := applyStatus(ctx, r.Client, kvc, st); err != nil {
			return ctrl.Result{}, err
		}
		return r.giveUpFinalBackup(ctx, kvc, "it failed: "+rec.Message)
	}
	if err := applyStatus(ctx, r.Client, kvc, st); err != nil {
		return ctrl.Result{}, err
	}
	r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, "FinalBackupCompleted", "FinalBackup",
		"final backup %s wrote %s (%d bytes, revision %d); deleting the cluster", rec.Job, rec.Location, rec.Size, rec.Revision)
	return ctrl.Result{}, r.applyFinalizer(ctx, kvc, false)
}

// giveUpFinalBackup fails open (the default) or keeps blocking (onFinalBackupFailure: Block).
func (r *KVClusterReconciler) giveUpFinalBackup(ctx context.Context, kvc *kvv1.KVCluster, why string) (ctrl.Result, error) {
	if kvc.Spec.Backup.OnFinalBackupFailure == kvv1.FinalBackupBlock {
		msg := fmt.Sprintf("the final backup did not succeed: %s. Deletion is blocked (onFinalBackupFailure: Block); "+
			"fix the cause and delete the Job %s to retry, or annotate %s=true to delete without it", why, specs.FinalBackupJobName(kvc), kvv1.AnnotationSkipFinalBackup)
		st := *kvc.Status.DeepCopy()
		prev := meta.FindStatusCondition(st.Conditions, kvv1.ConditionBackupSucceeded)
		if prev == nil || prev.Reason != ReasonFinalBackupFailed {
			r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, ReasonFinalBackupFailed, "FinalBackup", "%s", msg)
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: kvv1.ConditionBackupSucceeded, Status: metav1.ConditionFalse,
			Reason: ReasonFinalBackupFailed, Message: msg, ObservedGeneration: kvc.Generation, LastTransitionTime: metav1.NewTime(r.Clock.Now().Truncate(time.Second))})
		return ctrl.Result{RequeueAfter: time.Minute}, applyStatus(ctx, r.Client, kvc, st)
	}
	r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, ReasonFinalBackupFailed, "FinalBackup",
		"deleting without a final backup because %s; %s", why, lastBackupSentence(kvc))
	return ctrl.Result{}, r.applyFinalizer(ctx, kvc, false)
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
