// Package controllers holds the KVCluster reconciler.
package controllers

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	policyv1ac "k8s.io/client-go/applyconfigurations/policy/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// KVClusterReconciler drives a KVCluster towards its spec.
type KVClusterReconciler struct {
	Client   client.Client
	Recorder recorder.EventRecorder
	// Members asks etcd about the cluster; a fake in tests.
	Members members.Client
	Clock   clock.PassiveClock
	// EtcdRepository is the image repository used when a KVCluster does not name one.
	EtcdRepository string
	// BackupImage is the operator's own image, which backup Jobs run.
	BackupImage string
}

// +kubebuilder:rbac:groups=kvcluster.io,resources=kvclusters,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=kvcluster.io,resources=kvclusters/status,verbs=get;patch
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile reads as a story: load the cluster, apply what it should own, observe the members,
// let the current phase decide what comes next, record it in status.
func (r *KVClusterReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var kvc kvv1.KVCluster
	if err := r.Client.Get(ctx, req.NamespacedName, &kvc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !kvc.DeletionTimestamp.IsZero() {
		// The final backup and deregistration run first; then the garbage collector removes the owned objects.
		return r.finalize(ctx, &kvc)
	}
	log := log.FromContext(ctx)
	now := r.Clock.Now()

	if err := r.syncFinalizer(ctx, &kvc); err != nil {
		return ctrl.Result{}, err
	}
	sts, err := r.applyChildren(ctx, &kvc)
	if err != nil {
		return ctrl.Result{}, err
	}
	obs := r.observe(ctx, &kvc, sts)
	status, v := decide(&kvc, obs, specs.ClientEndpoint(&kvc), now)
	untilBackup, err := r.reconcileBackups(ctx, &kvc, &status, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := applyStatus(ctx, r.Client, &kvc, status); err != nil {
		return ctrl.Result{}, err
	}
	if v.phase != kvc.Status.Phase {
		log.Info("phase changed", "from", kvc.Status.Phase, "to", v.phase, "reason", v.reason, "message", v.message)
		eventType := corev1.EventTypeNormal
		if v.phase == kvv1.PhaseFailed {
			eventType = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(&kvc, nil, eventType, v.reason, "Phase"+string(v.phase), "%s", v.message)
	}
	requeue := v.requeueAfter
	if untilBackup > 0 && untilBackup < requeue {
		requeue = untilBackup
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// applyChildren applies every object the cluster owns and returns the cached StatefulSet (empty
// when it did not exist before this reconcile).
func (r *KVClusterReconciler) applyChildren(ctx context.Context, kvc *kvv1.KVCluster) (*appsv1.StatefulSet, error) {
	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: kvc.Namespace, Name: name} }
	if err := applyOwned(ctx, r.Client, key(specs.PeerServiceName(kvc)), &corev1.Service{}, specs.PeerService(kvc), corev1ac.ExtractService); err != nil {
		return nil, err
	}
	if err := applyOwned(ctx, r.Client, key(specs.ClientServiceName(kvc)), &corev1.Service{}, specs.ClientService(kvc), corev1ac.ExtractService); err != nil {
		return nil, err
	}
	if err := applyOwned(ctx, r.Client, key(kvc.Name), &policyv1.PodDisruptionBudget{}, specs.PodDisruptionBudget(kvc), policyv1ac.ExtractPodDisruptionBudget); err != nil {
		return nil, err
	}
	sts := &appsv1.StatefulSet{}
	images := specs.Images{EtcdRepository: r.EtcdRepository, Operator: r.BackupImage}
	if err := applyOwned(ctx, r.Client, key(kvc.Name), sts, specs.StatefulSet(kvc, images), appsv1ac.ExtractStatefulSet); err != nil {
		return nil, err
	}
	return sts, nil
}

// observe reads the member pods' readiness from the StatefulSet and asks etcd about itself.
func (r *KVClusterReconciler) observe(ctx context.Context, kvc *kvv1.KVCluster, sts *appsv1.StatefulSet) observation {
	obs := observation{readyMembers: sts.Status.ReadyReplicas}
	if sts.Status.Replicas == 0 {
		obs.etcdErr = fmt.Errorf("no member pods exist yet")
		return obs
	}
	cluster, err := r.Members.Cluster(ctx, specs.MemberClientURLs(kvc))
	if err != nil {
		obs.etcdErr = err
		return obs
	}
	obs.cluster = &cluster
	return obs
}

// SetupWithManager registers the reconciler. The KVCluster itself triggers a reconcile only when
// its spec (generation) or annotations change — not on our own status writes; owned objects
// trigger one on any change, so drift is put back and member readiness is noticed.
func (r *KVClusterReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&kvv1.KVCluster{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Owns(&batchv1.Job{}).
		Named("kvcluster").
		Complete(r)
}
