package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=delete

// maxDeletionActions bounds the actions of one pass (drain, fence, start a Job): each is planned
// once, as its outcome is part of what the pass plans from next. One time stands for the whole
// pass.
const maxDeletionActions = 4

// finalize runs while a KVCluster with the finalizer is being deleted. Its members still run (the
// guard keeps them even from a foreground deletion), so the deletion steps (plan.Deletion) drain
// the clients and fence writes, take a final backup through the same Job builder and status path
// as scheduled backups, and deregister; only then is the guard deleted and the garbage collector
// lets the rest go. A pass observes once, then plans and acts in turn, each action's outcome
// planned from, until a step waits.
func (r *KVClusterReconciler) finalize(ctx context.Context, cached *kvv1.KVCluster) (ctrl.Result, error) {
	if !slices.Contains(cached.Finalizers, kvv1.FinalizerFinalBackup) {
		return ctrl.Result{}, nil
	}
	kvc, obs, etcd, err := r.observeDeletion(ctx, cached)
	if err != nil || kvc == nil {
		return ctrl.Result{}, err
	}
	now := r.Clock.Now()
	p := plan.Deletion(kvc, obs, now, r.planConfig())
	for range maxDeletionActions {
		if p.Action == nil {
			break
		}
		if err := r.deletionAction(ctx, kvc, etcd, *p.Action, &obs); err != nil {
			// What the earlier steps did is kept (a fence is not raised twice); this one is retried.
			err = errors.Join(err, applyStatus(ctx, r.Client, &r.statusWrites, kvc, p.Status))
			r.announceDeletion(ctx, kvc, p)
			return ctrl.Result{}, err
		}
		p = plan.Deletion(kvc, obs, now, r.planConfig())
	}
	// The status is recorded while the object still exists (a no-op when nothing changed).
	if err := applyStatus(ctx, r.Client, &r.statusWrites, kvc, p.Status); err != nil {
		return ctrl.Result{}, errors.Join(p.Err, err)
	}
	r.announceDeletion(ctx, kvc, p)
	switch {
	case p.Err != nil:
		return ctrl.Result{}, p.Err
	case !p.Done:
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
	case p.OrphanGuard:
		// Deleted with --cascade=orphan, the members are meant to stay: the guard keeps owning them.
		orphaned := specs.Guard(kvc).WithAnnotations(map[string]string{specs.OrphanedAnnotation: "true"})
		if err := r.Client.Apply(ctx, orphaned, client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
			return ctrl.Result{}, fmt.Errorf("keep the deletion guard of orphaned members: %w", err)
		}
	case p.DeleteGuard:
		if err := r.deleteGuard(ctx, kvc.Namespace, kvc.Name, kvc.UID); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, r.applyFinalizer(ctx, kvc, false)
}

// announceDeletion records a pass's events and, for a final backup given up, logs and counts it:
// the operator's log and metrics outlive a deleted namespace, where events cannot be written.
func (r *KVClusterReconciler) announceDeletion(ctx context.Context, kvc *kvv1.KVCluster, p plan.DeletionPass) {
	r.record(kvc, p.Events...)
	if lost := p.Lost; lost != nil {
		finalBackupsLost.WithLabelValues(lost.Reason).Inc()
		log.FromContext(ctx).Error(nil, "a KVCluster is deleted without its final backup", "why", lost.Why, "lost", lost.Lost, "reason", lost.Reason)
	}
}

// deletionAction carries out what the first unfinished deletion step needs and adds its outcome
// to what the pass observed. Only a drain the API server refuses is returned as an error; what
// etcd or the API server answer to the other steps is their outcome.
func (r *KVClusterReconciler) deletionAction(ctx context.Context, kvc *kvv1.KVCluster, etcd members.Client, a plan.DeletionAction, obs *plan.DeletionObservation) error {
	acted := &obs.Acted
	switch a.Kind {
	case plan.DrainClients:
		if err := r.Client.Apply(ctx, specs.ClientService(kvc, a.DrainedAt), client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("drain the client Service %s/%s: %w", kvc.Namespace, specs.ClientServiceName(kvc), err)
		}
		obs.DrainedAt = &a.DrainedAt
	case plan.FenceWrites:
		revision, err := etcd.FenceWrites(ctx, specs.MemberClientURLs(kvc, obs.ClientScheme))
		acted.Fenced = &plan.Fence{Revision: revision, Err: err}
	case plan.StartJob:
		if acted.Started == nil {
			acted.Started = map[string]error{}
		}
		acted.Started[*a.Job.Name] = r.Client.Apply(ctx, a.Job, client.FieldOwner(specs.FieldManager), client.ForceOwnership)
	}
	return nil
}
