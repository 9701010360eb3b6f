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
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=delete

// maxDeletionActions bounds the actions of one pass (drain, fence, start a Job): each is planned
// once, as its outcome is part of what the pass plans from next.
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
	kvc, obs, err := r.observeDeletion(ctx, cached)
	if err != nil || kvc == nil {
		return ctrl.Result{}, err
	}
	p := plan.Deletion(kvc, obs, r.Clock.Now(), r.planConfig())
	for range maxDeletionActions {
		if p.Action == nil {
			break
		}
		if err := r.deletionAction(ctx, kvc, *p.Action, &obs.Acted); err != nil {
			// What the earlier steps did is kept (a fence is not raised twice); this one is retried.
			r.record(kvc, p.Events...)
			return ctrl.Result{}, errors.Join(err, applyStatus(ctx, r.Client, kvc, p.Status))
		}
		if p.Action.Kind == plan.DrainClients {
			obs.DrainedAt = &p.Action.DrainedAt
		}
		p = plan.Deletion(kvc, obs, r.Clock.Now(), r.planConfig())
	}
	// The status is recorded while the object still exists (a no-op when nothing changed).
	if err := applyStatus(ctx, r.Client, kvc, p.Status); err != nil {
		return ctrl.Result{}, errors.Join(p.Err, err)
	}
	r.record(kvc, p.Events...)
	if lost := p.Lost; lost != nil {
		finalBackupsLost.WithLabelValues(lost.Reason).Inc()
		log.FromContext(ctx).Error(nil, "a KVCluster is deleted without its final backup", "why", lost.Why, "lost", lost.Lost, "reason", lost.Reason)
	}
	if !p.Done {
		return ctrl.Result{RequeueAfter: 5 * time.Second}, p.Err
	}
	if obs.Orphaning {
		// Deleted with --cascade=orphan, the members are meant to stay: the guard keeps owning them.
		if obs.Guard != "" {
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

// deletionAction carries out what the first unfinished deletion step needs and records its
// outcome in acted. Only an error acting on Kubernetes is returned; what etcd or the API server
// answer to a step is its outcome.
func (r *KVClusterReconciler) deletionAction(ctx context.Context, kvc *kvv1.KVCluster, a plan.DeletionAction, acted *plan.Acted) error {
	switch a.Kind {
	case plan.DrainClients:
		if err := r.Client.Apply(ctx, specs.ClientService(kvc, a.DrainedAt), client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("drain the client Service %s/%s: %w", kvc.Namespace, specs.ClientServiceName(kvc), err)
		}
		acted.Drained = true
	case plan.FenceWrites:
		revision, err := r.Members.FenceWrites(ctx, specs.MemberClientURLs(kvc))
		acted.Fenced = &plan.Fence{Revision: revision, Err: err}
	case plan.StartJob:
		if acted.Started == nil {
			acted.Started = map[string]error{}
		}
		acted.Started[*a.Job.Name] = r.Client.Apply(ctx, a.Job, client.FieldOwner(specs.FieldManager), client.ForceOwnership)
	}
	return nil
}
