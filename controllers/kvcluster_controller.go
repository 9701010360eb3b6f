// Package controllers holds the KVCluster reconciler.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/certs"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
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
	// Operator is where the operator's own pods run: every cluster's NetworkPolicy admits them.
	Operator specs.OperatorPods
	// Leaving are the namespaces the operator watches only the KVClusters of (CacheOptionsLeaving):
	// being deleted, nothing else of theirs is cached.
	Leaving []string
	// Workers is how many clusters are reconciled at once (one cluster is never reconciled twice
	// at once): a cluster whose members answer slowly, or not at all, must not hold up the others.
	Workers int

	leaders leaderTracker
	// statusWrites are the versions its status writes made, until the cache shows them (load).
	statusWrites statusWrites
	// clientTLS keeps the TLS sessions each cluster's members offered (membersClient). Keyed by
	// name: a cluster made again under it has other Secrets, whose bytes start sessions anew.
	clientTLS certs.ClientConfigs[types.NamespacedName]
}

// CacheOptions make the manager's cache hold only the objects the operator owns (labelled as
// its own), not every Pod, Job or StatefulSet of the Kubernetes cluster, and of those only what it
// reads: of Pods, claims and Jobs no managed fields, and of Pods and claims only what observe reads
// (cachedForm); of the objects it applies, instead of their managed fields, the digest of its own
// part of them (cachedIntent), as of KVClusters the digest of the status it owns; of all, one
// copy of what their metadata repeat (sharingMetadata). Given namespaces, it watches only those
// (an install whose Roles grant nothing elsewhere); none: all.
func CacheOptions(namespaces ...string) cache.Options { return CacheOptionsLeaving(namespaces, nil) }

// An operator that watches some namespaces asks at start whether it may work in each (its Role
// there may be gone), rather than rely on every cluster granting system:basic-user.
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=selfsubjectaccessreviews,verbs=create

// CacheOptionsLeaving are CacheOptions for an operator that watches namespaces, where the
// namespaces leaving are being deleted: their KVClusters are watched too (a ClusterRole grants
// KVClusters everywhere), so that their finalizers are let go, and nothing else of them is (their
// Roles may be gone already, and a cache that cannot list is never ready).
func CacheOptionsLeaving(namespaces, leaving []string) cache.Options {
	owned := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{specs.ManagedByLabel: specs.ManagedByValue}),
		Transform: func(obj any) (any, error) { return sharingMetadata(sharingCAs(cachedIntent(obj))), nil }}
	options := cache.Options{ByObject: map[client.Object]cache.ByObject{
		&appsv1.StatefulSet{}:           owned,
		&corev1.Service{}:               owned,
		&policyv1.PodDisruptionBudget{}: owned,
		&networkingv1.NetworkPolicy{}:   owned,
		&corev1.ConfigMap{}:             owned,
		&corev1.Secret{}:                owned,
	}}
	if len(namespaces) > 0 {
		options.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			options.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	if len(namespaces) > 0 && len(leaving) > 0 {
		clusters := cache.ByObject{Namespaces: maps.Clone(options.DefaultNamespaces)}
		for _, ns := range leaving {
			clusters.Namespaces[ns] = cache.Config{}
		}
		options.ByObject[&kvv1.KVCluster{}] = clusters
	}
	trimmed := owned
	trimmed.Transform = func(obj any) (any, error) { return sharingMetadata(cachedForm(obj)), nil }
	for _, o := range notComparedKinds() {
		options.ByObject[o] = trimmed
	}
	options.DefaultTransform = func(obj any) (any, error) {
		if _, ok := obj.(*kvv1.KVCluster); ok {
			obj = cachedIntent(obj)
		}
		return sharingMetadata(obj), nil
	}
	return options
}

// notComparedKinds are the kinds the operator never compares with what it owns, so the cache
// keeps none of their managed fields (cachedForm); it reads them by cluster (clusterIndex), many
// per cluster. Members' claims carry the labels of the StatefulSet's claim template.
func notComparedKinds() []client.Object {
	return []client.Object{&corev1.Pod{}, &corev1.PersistentVolumeClaim{}, &batchv1.Job{}}
}

var stripManagedFields = cache.TransformStripManagedFields()

// cachedForm is what the cache keeps of an object of notComparedKinds: no managed fields; of a
// Pod, besides, only what the operator reads of it (its metadata but its annotations and the
// labels it does not read, podLabelsRead; each container's name and the flags PodTransport reads;
// its phase, readiness, and whether each container runs or how it ended, and its restarts:
// observePods, memberPodStateOf, TerminationMessage). The rest of a pod's spec (probes,
// environment, mounts, volumes, tolerations) is most of its size, one pod per member, and the
// operator reads it from the StatefulSet's template instead. Of a claim, its
// metadata but its annotations, its StorageClass, the size asked for and had, its phase and a
// pending file system resize (claimObserved, plan.ClaimBelongs). The sizes are one shared list
// per size (sharedStorage): a map each, they had been more than half of a claim's heap. Of a Job
// (a backup's, a deletion step's), its metadata, when it started and its conditions (NewJob,
// BackupRecordOf, JobFailureMessage): a cluster keeps several finished backup Jobs
// (backup.jobHistoryLimit), and their pod template was most of their size. It
// changes obj in place (the informer's own copy), and a second pass changes nothing (the
// informer may make two).
func cachedForm(obj any) any {
	obj, _ = stripManagedFields(obj) // never fails
	if job, ok := obj.(*batchv1.Job); ok {
		job.Spec = batchv1.JobSpec{}
		job.Status = batchv1.JobStatus{StartTime: job.Status.StartTime, Conditions: job.Status.Conditions}
		return job
	}
	if claim, ok := obj.(*corev1.PersistentVolumeClaim); ok {
		claim.Annotations = nil // the binder's and the provisioner's
		claim.Spec = corev1.PersistentVolumeClaimSpec{StorageClassName: claim.Spec.StorageClassName,
			Resources: corev1.VolumeResourceRequirements{Requests: sharedStorage.of(claim.Spec.Resources.Requests)}}
		var resizing []corev1.PersistentVolumeClaimCondition
		for _, c := range claim.Status.Conditions {
			if c.Type == corev1.PersistentVolumeClaimFileSystemResizePending {
				resizing = append(resizing, c)
			}
		}
		claim.Status = corev1.PersistentVolumeClaimStatus{Phase: claim.Status.Phase, Capacity: sharedStorage.of(claim.Status.Capacity), Conditions: resizing}
		return claim
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj
	}
	containers := make([]corev1.Container, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		containers[i] = corev1.Container{Name: c.Name, Args: specs.TransportArgs(c.Args)}
	}
	statuses := make([]corev1.ContainerStatus, len(pod.Status.ContainerStatuses))
	for i, c := range pod.Status.ContainerStatuses {
		state := corev1.ContainerState{Terminated: c.State.Terminated} // a Job's outcome: TerminationMessage
		if c.State.Running != nil {
			state.Running = &sharedRunning // since when is not read
		}
		statuses[i] = corev1.ContainerStatus{Name: c.Name, State: state, RestartCount: c.RestartCount}
	}
	var conditions []corev1.PodCondition
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			conditions = append(conditions, corev1.PodCondition{Type: c.Type, Status: c.Status})
		}
	}
	pod.Labels = labelsRead(pod.Labels)
	pod.Annotations = nil
	pod.Spec = corev1.PodSpec{Containers: containers}
	pod.Status = corev1.PodStatus{Phase: pod.Status.Phase, Conditions: conditions, ContainerStatuses: statuses}
	return pod
}

// podLabelsRead are the labels the operator reads of a pod: its cluster (clusterIndex), a member's
// StatefulSet revision (isMemberPod, memberPodStateOf), a backup's Job (jobReportFrom). Without
// the labels each member has of its own (its name, its index), the member pods of one cluster and
// revision have one set of labels, which the cache then holds once (sharingMetadata).
var podLabelsRead = []string{specs.ClusterLabel, appsv1.StatefulSetRevisionLabel, batchv1.ControllerUidLabel}

// labelsRead is the part of a pod's labels in podLabelsRead.
func labelsRead(labels map[string]string) map[string]string {
	var read map[string]string
	for _, k := range podLabelsRead {
		if v, ok := labels[k]; ok {
			if read == nil {
				read = make(map[string]string, len(podLabelsRead))
			}
			read[k] = v
		}
	}
	return read
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
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// The cluster's TLS Secrets (the cache holds only the operator's own; a Secret a KVCluster names
// is read by name).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;patch;delete

// Reconcile reads as a story: load the cluster (once the cache shows the operator's last status
// write to it); hold the deletion finalizer whenever deletion has steps to run; observe everything
// once (observe.go); decide everything in one pure function (plan.Make); carry the plan out
// (act.go). A cluster being deleted goes through its deletion steps instead (deletion.go).
func (r *KVClusterReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	defer func() {
		// Only act lowers the queue priority of what comes next, and only for a poll. Everything
		// else (a retry after an error, a deletion step) has the normal priority, whatever the
		// priority this reconcile was taken at (all of them low after the operator starts).
		if res.Priority == nil {
			res.Priority = new(0)
		}
	}()
	var kvc kvv1.KVCluster
	if err := r.load(ctx, req.NamespacedName, &kvc); apierrors.IsNotFound(err) {
		r.leaders.forget(req.NamespacedName)
		r.statusWrites.forget(req.NamespacedName)
		r.clientTLS.Forget(req.NamespacedName)
		if slices.Contains(r.Leaving, req.Namespace) {
			return ctrl.Result{}, nil // its guard goes with the namespace
		}
		// Gone without its finalizer (removed by hand): its guard would keep its members for ever.
		return ctrl.Result{}, countError("load", r.deleteGuard(ctx, req.Namespace, req.Name, ""))
	} else if errors.Is(err, errCacheBehind) {
		log.FromContext(ctx).V(1).Info(err.Error())
		return ctrl.Result{RequeueAfter: cacheCatchUp}, nil // status writes start no reconcile
	} else if err != nil {
		return ctrl.Result{}, countError("load", err)
	}
	if !kvc.DeletionTimestamp.IsZero() {
		// The final backup and deregistration run first; then the garbage collector removes the owned objects.
		return timeStep("finalize", func() (ctrl.Result, error) { return r.finalize(ctx, &kvc) })
	}
	if want, change := plan.FinalizerChange(&kvc); change {
		if err := r.applyFinalizer(ctx, &kvc, want); err != nil {
			return ctrl.Result{}, countError("load", err)
		}
	}
	now := r.Clock.Now()
	var etcd members.Client
	obs, err := timeStep("observe", func() (obs plan.Observation, err error) {
		obs, etcd, err = r.observe(ctx, &kvc)
		return obs, err
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	r.leaders.saw(&kvc, observedLeader(obs))
	p, _ := timeStep("plan", func() (plan.Plan, error) { return plan.Make(&kvc, obs, now, r.planConfig()), nil })
	return timeStep("act", func() (ctrl.Result, error) { return r.act(ctx, &kvc, obs, p, now, etcd) })
}

// A reconcile that finds the cache behind its last status write reads the KVCluster again every
// cacheReread, for up to cacheCatchUp; then it gives way (errCacheBehind), and looks again after
// cacheCatchUp.
const (
	cacheReread  = 5 * time.Millisecond
	cacheCatchUp = 250 * time.Millisecond
)

var errCacheBehind = errors.New("the cache does not hold the operator's last status write yet")

// load reads the KVCluster from the cache; while it is older than the version the operator's last
// status write to it made (statusWrites.behind), again every cacheReread, for up to cacheCatchUp
// (then errCacheBehind). Decided on an older status, a reconcile would announce again what the
// last one did and write back a status that is behind. The cache catches up within milliseconds,
// and a reconcile that waits here keeps its place in the queue, where one requeued would not.
func (r *KVClusterReconciler) load(ctx context.Context, key types.NamespacedName, kvc *kvv1.KVCluster) error {
	deadline := time.Now().Add(cacheCatchUp)
	for {
		*kvc = kvv1.KVCluster{}
		if err := r.Client.Get(ctx, key, kvc); err != nil {
			return err
		}
		if !kvc.DeletionTimestamp.IsZero() || !r.statusWrites.behind(kvc, time.Now()) {
			return nil // (finalize reads a KVCluster being deleted afresh from the API server)
		}
		if time.Now().After(deadline) {
			return errCacheBehind
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(cacheReread):
		}
	}
}

// SetupWithManager registers the reconciler. The KVCluster itself triggers a reconcile only when
// its spec (generation) or annotations change — not on our own status writes; owned objects trigger
// one on any change, so drift is put back, except the StatefulSet's counts of pods
// (statefulSetChanged) and the PodDisruptionBudget's status (ownedPartChanged). A member pod
// triggers one when what the operator reads from it changes (memberPodChanged), so a member turning
// Ready is noticed at once, not when the StatefulSet controller next writes its status, and ahead
// of other queued work (memberChangePriority). A deletion guard (owned by no one) triggers one for
// its cluster, so a guard left behind is removed.
func (r *KVClusterReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := registerClusterIndex(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&kvv1.KVCluster{}, builder.WithPredicates(clusterChanged)).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if o.GetLabels()[specs.GuardLabel] != "true" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: o.GetLabels()[specs.ClusterLabel]}}}
		})).
		Watches(&corev1.Pod{}, memberPodEvents, builder.WithPredicates(memberPodChanged)).
		Owns(&appsv1.StatefulSet{}, builder.WithPredicates(statefulSetChanged)).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}, builder.WithPredicates(ownedPartChanged)).
		Owns(&networkingv1.NetworkPolicy{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&batchv1.Job{}).
		Owns(&corev1.Secret{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.Workers, 1)}).
		Named("kvcluster").
		Complete(r)
}

// clusterIndex indexes the cache's Pods, claims and Jobs by the cluster they belong to (its
// label): a label selector alone is matched against every object of the namespace, and with a
// thousand clusters in one namespace that took half the operator's CPU (a CPU profile of the
// fleet benchmark at N=1000, while creating).
const clusterIndex = specs.ClusterLabel

// indexByCluster is the value clusterIndex indexes an object by: its cluster label.
func indexByCluster(o client.Object) []string {
	if name := o.GetLabels()[specs.ClusterLabel]; name != "" {
		return []string{name}
	}
	return nil
}

// registerClusterIndex registers clusterIndex for the notComparedKinds.
func registerClusterIndex(ctx context.Context, indexer client.FieldIndexer) error {
	for _, o := range notComparedKinds() {
		if err := indexer.IndexField(ctx, o, clusterIndex, indexByCluster); err != nil {
			return fmt.Errorf("index %T by cluster: %w", o, err)
		}
	}
	return nil
}

// ofCluster selects the objects of the cluster through clusterIndex (the cache's, not the API
// server's: a direct client needs the label).
func ofCluster(kvc *kvv1.KVCluster) client.MatchingFields {
	return client.MatchingFields{clusterIndex: kvc.Name}
}

// memberPodCluster is the cluster a member pod belongs to; none for a Job's pod.
func memberPodCluster(_ context.Context, o client.Object) []reconcile.Request {
	if pod, ok := o.(*corev1.Pod); !ok || !isMemberPod(pod) || pod.Labels[specs.ClusterLabel] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: o.GetLabels()[specs.ClusterLabel]}}}
}

// memberChangePriority is the work queue priority of a reconcile a member pod's change starts:
// above that of every other event (0), so a cluster whose member became Ready, stopped or went is
// looked at before the queue's other work — new clusters' first reconciles, owned objects'
// changes — whatever that holds. With 100 clusters created at once, the clusters whose members
// were Ready first had waited ~2 s behind the others' first reconciles (the fleet benchmark's
// audit log).
const memberChangePriority = 1

// memberPodEvents enqueues a member pod's cluster (memberPodCluster) at memberChangePriority; at
// the low priority of everything the operator's start lists, for the pods it lists then.
var memberPodEvents = handler.Funcs{
	CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		priority := memberChangePriority
		if e.IsInInitialList {
			priority = handler.LowPriority
		}
		enqueueAt(q, priority, memberPodCluster(ctx, e.Object))
	},
	UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		enqueueAt(q, memberChangePriority, append(memberPodCluster(ctx, e.ObjectOld), memberPodCluster(ctx, e.ObjectNew)...))
	},
	DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		enqueueAt(q, memberChangePriority, memberPodCluster(ctx, e.Object))
	},
}

// enqueueAt adds the requests to the work queue at the priority (a queue without priorities
// takes them in order).
func enqueueAt(q workqueue.TypedRateLimitingInterface[reconcile.Request], priority int, reqs []reconcile.Request) {
	pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request])
	for _, req := range reqs {
		if ok {
			pq.AddWithOpts(priorityqueue.AddOpts{Priority: &priority}, req)
		} else {
			q.Add(req)
		}
	}
}

// clusterChanged lets through a KVCluster's creation and deletion, and an update that changes its
// spec (generation) or the annotations people set: not the digest of the status the operator owns,
// which the cache keeps among them (cachedIntent) and which each of its status writes changes.
var clusterChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() {
			return true
		}
		return !maps.Equal(withoutIntent(e.ObjectOld.GetAnnotations()), withoutIntent(e.ObjectNew.GetAnnotations()))
	},
}

// withoutIntent is annotations without the cache's digest (intentAnnotation).
func withoutIntent(annotations map[string]string) map[string]string {
	if _, ok := annotations[intentAnnotation]; !ok {
		return annotations
	}
	kept := maps.Clone(annotations)
	delete(kept, intentAnnotation)
	return kept
}

// memberPodChanged lets through a pod's creation and deletion, and an update that changes what
// the operator reads from it (readiness, the etcd container running or restarting, deletion, the
// revision): a pod's other status updates while it starts would each be a reconcile for nothing.
var memberPodChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, oldOK := e.ObjectOld.(*corev1.Pod)
		updated, newOK := e.ObjectNew.(*corev1.Pod)
		return !oldOK || !newOK || memberPodStateOf(old) != memberPodStateOf(updated)
	},
}

// statefulSetChanged lets through a StatefulSet's creation and deletion, and an update that
// changes what the operator owns or reads: its spec (generation), labels, annotations or owners
// (drift to put back), or the revision its controller has seen (observedGeneration,
// updateRevision). Not the controller's counts of created and ready pods, which change with each
// member pod: the pod watch has seen that change first.
var statefulSetChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, oldOK := e.ObjectOld.(*appsv1.StatefulSet)
		updated, newOK := e.ObjectNew.(*appsv1.StatefulSet)
		if !oldOK || !newOK {
			return true
		}
		return ownedPartsDiffer(old, updated) ||
			old.Status.ObservedGeneration != updated.Status.ObservedGeneration || old.Status.UpdateRevision != updated.Status.UpdateRevision
	},
}

// ownedPartChanged lets through an update of an object whose status the operator never reads
// only when it changes what the operator owns or must notice (ownedPartsDiffer). A
// PodDisruptionBudget's status changes with each member pod's readiness (its controller counts
// healthy pods): about four updates per cluster while it is created (the fleet benchmark's audit
// log at N=100), each of which was a reconcile for nothing.
var ownedPartChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool { return ownedPartsDiffer(e.ObjectOld, e.ObjectNew) },
}

// ownedPartsDiffer: the update changed the object's spec (generation), labels, annotations (in
// the cache, the digest of what the operator owns among them: cachedIntent) or owners (drift to
// put back), or started its deletion.
func ownedPartsDiffer(old, updated client.Object) bool {
	return old.GetGeneration() != updated.GetGeneration() || !maps.Equal(old.GetLabels(), updated.GetLabels()) ||
		!maps.Equal(old.GetAnnotations(), updated.GetAnnotations()) ||
		!equality.Semantic.DeepEqual(old.GetOwnerReferences(), updated.GetOwnerReferences()) ||
		!old.GetDeletionTimestamp().Equal(updated.GetDeletionTimestamp())
}
