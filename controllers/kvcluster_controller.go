// Package controllers holds the KVCluster reconciler.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	policyv1ac "k8s.io/client-go/applyconfigurations/policy/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// KVClusterReconciler drives a KVCluster towards its spec.
type KVClusterReconciler struct {
	// Client reads from the manager's cache, which holds only objects labelled as the operator's.
	Client client.Client
	// APIReader reads from the API server: what the cache cannot show (an object someone else
	// created under a name the operator uses).
	APIReader client.Reader
	Recorder  recorder.EventRecorder
	// Members asks etcd about the cluster; a fake in tests.
	Members members.Client
	Clock   clock.PassiveClock
	// EtcdRepository is the image repository used when a KVCluster does not name one.
	EtcdRepository string
	// BackupImage is the operator's own image, which backup Jobs run.
	BackupImage string
	// Workers is how many clusters are reconciled at once (one cluster is never reconciled twice
	// at once): a cluster whose members answer slowly, or not at all, must not hold up the others.
	Workers int
}

// CacheOptions make the manager's cache hold only the objects the operator owns (labelled as
// its own), not every Pod, Job or StatefulSet of the Kubernetes cluster.
func CacheOptions() cache.Options {
	owned := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{specs.ManagedByLabel: specs.ManagedByValue})}
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&appsv1.StatefulSet{}:           owned,
		&corev1.Service{}:               owned,
		&policyv1.PodDisruptionBudget{}: owned,
		&batchv1.Job{}:                  owned,
		&corev1.Pod{}:                   owned,
		// Members' claims carry the labels of the StatefulSet's claim template.
		&corev1.PersistentVolumeClaim{}: owned,
		&corev1.ConfigMap{}:             owned,
	}}
}

// +kubebuilder:rbac:groups=kvcluster.io,resources=kvclusters,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=kvcluster.io,resources=kvclusters/status,verbs=get;patch
// Children block their owner's deletion (blockOwnerDeletion), which clusters enforcing owner
// references allow only to those who may update the owner's finalizers.
// +kubebuilder:rbac:groups=kvcluster.io,resources=kvclusters/finalizers,verbs=update
// delete on what the deletion guard owns: clusters enforcing owner references let only those who
// may delete an object change its owner references.
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile reads as a story: load the cluster, apply what it should own, observe the members,
// let the current phase decide what comes next, record it in status.
func (r *KVClusterReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var kvc kvv1.KVCluster
	if err := r.Client.Get(ctx, req.NamespacedName, &kvc); apierrors.IsNotFound(err) {
		// Gone without its finalizer (removed by hand): its guard would keep its members for ever.
		return ctrl.Result{}, r.deleteGuard(ctx, req.Namespace, req.Name, "")
	} else if err != nil {
		return ctrl.Result{}, err
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
	obs, err := r.observe(ctx, &kvc)
	if err != nil {
		return ctrl.Result{}, err
	}
	if obs.foreignChildren, obs.stsForeign, err = r.foreignChildren(ctx, &kvc); err != nil {
		return ctrl.Result{}, err
	}
	if obs.leftoverClaims, err = r.leftoverClaims(ctx, &kvc, obs); err != nil {
		return ctrl.Result{}, err
	}
	// A failed apply does not stop the reconcile: status still says how the cluster is (and why
	// the apply failed), and backups still run. Transient errors are returned at the end, so the
	// reconcile is retried with backoff.
	var applyErr error
	if !obs.conflicted() {
		var notOwned *notOwnedError
		switch err := r.applyChildren(ctx, &kvc, obs); {
		case errors.As(err, &notOwned):
			obs.foreignChildren = append(obs.foreignChildren, notOwned.what)
		case rejected(err):
			obs.applyRejected = err.Error()
		default:
			applyErr = err
		}
	}
	obs.rollout = planRollout(&kvc, obs)
	status, v := decide(&kvc, obs, specs.ClientEndpoint(&kvc), now)
	acted := false
	if v.phase == kvv1.PhaseUpgrading && applyErr == nil { // a rollout step waits for the objects it builds on
		if acted, err = r.act(ctx, &kvc, obs, obs.rollout); err != nil {
			return ctrl.Result{}, err
		}
	}
	if disarmed, err := r.disarmStaleAlarms(ctx, &kvc, obs); err != nil {
		return ctrl.Result{}, err
	} else if disarmed {
		acted = true
	}
	untilBackup, err := r.reconcileBackups(ctx, &kvc, &status, now, !obs.stsForeign)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := applyStatus(ctx, r.Client, &kvc, status); err != nil {
		return ctrl.Result{}, err
	}
	if v.phase != kvc.Status.Phase {
		log.Info("phase changed", "from", kvc.Status.Phase, "to", v.phase, "reason", v.reason, "message", v.message)
		eventType := corev1.EventTypeNormal
		if v.phase == kvv1.PhaseFailed || warningReasons[v.reason] {
			eventType = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(&kvc, nil, eventType, v.reason, "Phase"+string(v.phase), "%s", v.message)
	} else if warningReasons[v.reason] && v.reason != previousReason(&kvc) {
		// A problem that needs a person can arise without a phase change: say so once.
		r.Recorder.Eventf(&kvc, nil, corev1.EventTypeWarning, v.reason, "Phase"+string(v.phase), "%s", v.message)
	}
	requeue := v.requeueAfter
	if acted { // a membership change shows in etcd at once; apply what follows from it soon
		requeue = time.Second
	}
	if untilBackup > 0 && untilBackup < requeue {
		requeue = untilBackup
	}
	return ctrl.Result{RequeueAfter: requeue}, applyErr
}

// rejected: the API server refused a write for a reason that does not pass by itself (a
// validating admission policy or webhook, a quota, missing permissions, an invalid object).
func rejected(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) || apierrors.IsRequestEntityTooLargeError(err)
}

// warningReasons are verdicts that need a person even when the phase stays the same.
var warningReasons = map[string]bool{ReasonUnknownMember: true, ReasonObjectConflict: true, ReasonLeftoverVolumes: true, ReasonApplyRejected: true}

// previousReason is the reason of the verdict the last status recorded (the Ready condition
// always carries it).
func previousReason(kvc *kvv1.KVCluster) string {
	if c := meta.FindStatusCondition(kvc.Status.Conditions, kvv1.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

// applyChildren applies every object the cluster owns. The guard goes first (what the deletion
// steps need names it as an owner), the membership ConfigMap before the StatefulSet, whose pods
// read it when they start; a guard no longer wanted goes last, once nothing names it.
func (r *KVClusterReconciler) applyChildren(ctx context.Context, kvc *kvv1.KVCluster, obs observation) error {
	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: kvc.Namespace, Name: name} }
	guard, err := r.guardUID(ctx, kvc)
	if err != nil {
		return err
	}
	if err := applyOwned(ctx, r.Client, kvc, key(specs.PeerServiceName(kvc)), &corev1.Service{}, specs.PeerService(kvc, guard), corev1ac.ExtractService); err != nil {
		return err
	}
	if err := applyOwned(ctx, r.Client, kvc, key(specs.ClientServiceName(kvc)), &corev1.Service{}, specs.ClientService(kvc, time.Time{}), corev1ac.ExtractService); err != nil {
		return err
	}
	if err := applyOwned(ctx, r.Client, kvc, key(kvc.Name), &policyv1.PodDisruptionBudget{}, specs.PodDisruptionBudget(kvc, disruptionBase(kvc, obs)),
		policyv1ac.ExtractPodDisruptionBudget); err != nil {
		return err
	}
	membership, replicas := desiredMembership(kvc, obs)
	if err := applyOwned(ctx, r.Client, kvc, key(specs.MembershipConfigMapName(kvc)), &corev1.ConfigMap{},
		specs.MembershipConfigMap(kvc, membership, guard), corev1ac.ExtractConfigMap); err != nil {
		return err
	}
	set := specs.MemberSet{
		Images:           specs.Images{EtcdRepository: r.EtcdRepository, Operator: r.BackupImage},
		Replicas:         replicas,
		Bootstrapping:    !bootstrapped(kvc, obs),
		Guard:            guard,
		UnlabelledClaims: obs.stsClaimsUnlabelled,
	}
	if err := applyOwned(ctx, r.Client, kvc, key(kvc.Name), &appsv1.StatefulSet{}, specs.StatefulSet(kvc, set), appsv1ac.ExtractStatefulSet); err != nil {
		return err
	}
	if guard == "" {
		return r.deleteGuard(ctx, kvc.Namespace, kvc.Name, kvc.UID)
	}
	return nil
}

// disarmStaleAlarms clears the alarms a cluster inherited: those of members it does not have and,
// while a restored cluster forms, every alarm (restored under the same name, its members have the
// IDs of the cluster the backup came from). A final backup is taken with writes fenced by a
// NOSPACE alarm, which the snapshot carries: a restored cluster would refuse writes for ever. A
// real NOSPACE alarm comes back by itself on the next write over the quota.
func (r *KVClusterReconciler) disarmStaleAlarms(ctx context.Context, kvc *kvv1.KVCluster, obs observation) (bool, error) {
	if obs.cluster == nil || !obs.cluster.HasLeader {
		return false, nil
	}
	stale := obs.cluster.StaleAlarms()
	if kvc.Spec.Restore != nil && (kvc.Status.Phase == "" || kvc.Status.Phase == kvv1.PhaseCreating) {
		stale = obs.cluster.Alarms
	}
	for _, a := range stale {
		if err := r.Members.DisarmAlarm(ctx, clientURLs(kvc, obs), a); err != nil {
			log.FromContext(ctx).Info("cannot disarm a stale alarm yet", "alarm", a.Type, "member", fmt.Sprintf("%x", a.MemberID), "error", err.Error())
			return false, nil
		}
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, "StaleAlarmDisarmed", "Disarm",
			"disarmed the %s alarm of member %x, which came with the restored snapshot", a.Type, a.MemberID)
	}
	return len(stale) > 0, nil
}

// SetupWithManager registers the reconciler. The KVCluster itself triggers a reconcile only when
// its spec (generation) or annotations change — not on our own status writes; owned objects
// trigger one on any change, so drift is put back and member readiness is noticed. A deletion
// guard (owned by no one) triggers one for its cluster, so a guard left behind is removed.
func (r *KVClusterReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&kvv1.KVCluster{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if o.GetLabels()[specs.GuardLabel] != "true" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: o.GetLabels()[specs.ClusterLabel]}}}
		})).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&batchv1.Job{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.Workers, 1)}).
		Named("kvcluster").
		Complete(r)
}
