package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kvv1ac "github.com/kvcluster/kvcluster-operator/apis/applyconfiguration/apis/v1alpha1"
	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/certs"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=patch

// act carries out a plan, in its order, and decides nothing: adopted volumes, the owned objects, one rollout step, stale alarms, backup Jobs, then the status and its events. A
// failed apply does not stop it: status still says how the cluster is (and why the apply failed),
// and backups still run. An apply the API server refuses for good is itself observed, and the
// cluster planned again with it. Transient errors are returned at the end, so the reconcile is
// retried with backoff.
func (r *KVClusterReconciler) act(ctx context.Context, kvc *kvv1.KVCluster, obs plan.Observation, p plan.Plan, now time.Time, etcd members.Client) (ctrl.Result, error) {
	if err := r.adoptClaims(ctx, kvc, p.AdoptClaims); err != nil {
		return ctrl.Result{}, err
	}
	var applyErr error
	if p.Children != nil {
		var notOwned *notOwnedError
		switch err := r.applyChildren(ctx, kvc, p.Guard, p.TLS, *p.Children, now); {
		case errors.As(err, &notOwned):
			obs.ForeignChildren = append(obs.ForeignChildren, notOwned.what)
			p = plan.Make(kvc, obs, now, r.planConfig())
		case rejected(err):
			obs.ApplyRejected = err.Error()
			p = plan.Make(kvc, obs, now, r.planConfig())
		default:
			applyErr = err
		}
	}
	if applyErr == nil && len(p.ExpandClaims) > 0 {
		switch err := r.expandClaims(ctx, kvc, p.ExpandClaims); {
		case rejected(err):
			obs.ApplyRejected = err.Error()
			p = plan.Make(kvc, obs, now, r.planConfig())
		default:
			applyErr = err
		}
	}
	acted := false
	if p.Rollout.Action != plan.ActWait && applyErr == nil { // a rollout step waits for the objects it builds on
		var err error
		if acted, err = r.rolloutStep(ctx, kvc, etcd, p.Rollout, p.Endpoints, obs.Cluster); err != nil {
			return ctrl.Result{}, err
		}
	}
	if disarmed := r.disarm(ctx, kvc, etcd, p.Disarm, p.Endpoints); disarmed {
		acted = true
	}
	if compacted, defragmented, disarmed := r.freeSpace(ctx, kvc, etcd, p.FreeSpace, p.Endpoints); compacted > 0 || defragmented != "" || disarmed {
		obs.Compacted, obs.Defragmented, obs.Disarmed, acted = compacted, defragmented, disarmed, true
		p = plan.Make(kvc, obs, now, r.planConfig())
	}
	if err := r.backupJobs(ctx, kvc, p.Backups); err != nil {
		return ctrl.Result{}, err
	}
	if err := applyStatus(ctx, r.Client, &r.statusWrites, kvc, p.Status); err != nil {
		return ctrl.Result{}, err
	}
	if p.Status.Phase != kvc.Status.Phase {
		log.FromContext(ctx).Info("phase changed", "from", kvc.Status.Phase, "to", p.Status.Phase, "reason", p.Reason, "message", p.Message)
	}
	r.record(kvc, p.Events...)
	requeue, priority := p.RequeueAfter, 0
	if acted { // a membership change shows in etcd at once; apply what follows from it soon
		requeue = min(requeue, time.Second)
	} else if p.OnlyLooksAgain {
		priority = handler.LowPriority
	}
	// The priority is always given: a reconcile that was itself a poll would otherwise pass its
	// low priority on to the step it just took.
	if applyErr != nil { // retried with backoff, which a requeue time would only contradict
		return ctrl.Result{Priority: &priority}, applyErr
	}
	etcd.NotNeededFor(p.Endpoints, requeue) // an event may wake the cluster sooner: it dials again
	return ctrl.Result{RequeueAfter: requeue, Priority: &priority}, nil
}

func (r *KVClusterReconciler) planConfig() plan.Config {
	return plan.Config{Images: specs.Images{EtcdRepository: r.EtcdRepository, Operator: r.BackupImage}}
}

func (r *KVClusterReconciler) record(kvc *kvv1.KVCluster, events ...plan.Event) {
	for _, e := range events {
		r.Recorder.Eventf(kvc, nil, e.Type, e.Reason, e.Action, "%s", e.Message)
	}
}

// rejected: the API server refused a write for a reason that does not pass by itself (a
// validating admission policy or webhook, a quota, missing permissions, an invalid object).
func rejected(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) || apierrors.IsRequestEntityTooLargeError(err)
}

// applyFinalizer applies the finalizer (present) or gives it up. It is applied to metadata only
// (the operator never writes the spec), with the UID so a KVCluster deleted meanwhile is never
// re-created.
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

// adoptClaims labels leftover claims with this cluster's UID (kvcluster.io/adopt-volumes), so
// they stay its own once the annotation is gone.
func (r *KVClusterReconciler) adoptClaims(ctx context.Context, kvc *kvv1.KVCluster, claims []plan.ClaimUpdate) error {
	for _, c := range claims {
		if err := r.Client.Apply(ctx, specs.MemberClaim(kvc, c.Name, c.UID, c.Size), client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("adopt volume claim %s/%s: %w", kvc.Namespace, c.Name, err)
		}
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, plan.EventVolumeAdopted, "Adopt",
			"adopted volume claim %s (%s=true): its member starts on the data it holds", c.Name, kvv1.AnnotationAdoptVolumes)
	}
	return nil
}

// expandClaims asks for more space in members' claims; their StorageClass's provisioner grows the
// volumes (see plan.ClaimExpansion).
func (r *KVClusterReconciler) expandClaims(ctx context.Context, kvc *kvv1.KVCluster, claims []plan.ClaimUpdate) error {
	for _, c := range claims {
		if err := r.Client.Apply(ctx, specs.MemberClaim(kvc, c.Name, c.UID, c.Size), client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("expand volume claim %s/%s to %s: %w", kvc.Namespace, c.Name, c.Size.String(), err)
		}
		claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: kvc.Namespace}}
		r.Recorder.Eventf(kvc, claim, corev1.EventTypeNormal, plan.EventVolumeExpansion, "ExpandVolume",
			"asked for %s in volume claim %s (was %s): its StorageClass's provisioner grows the volume", c.Size.String(), c.Name, c.From.String())
	}
	return nil
}

// applyChildren applies every object the cluster owns. The guard goes first (what the deletion
// steps need names it as an owner), the membership ConfigMap before the StatefulSet, whose pods
// read it when they start; a guard no longer wanted goes last, once nothing names it.
func (r *KVClusterReconciler) applyChildren(ctx context.Context, kvc *kvv1.KVCluster, wantGuard bool, tls plan.TLS, ch plan.Children, now time.Time) error {
	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: kvc.Namespace, Name: name} }
	var guard types.UID
	if wantGuard {
		var err error
		if guard, err = r.applyGuard(ctx, kvc); err != nil {
			return err
		}
	}
	if err := r.applyTLS(ctx, kvc, tls, guard, now); err != nil {
		return err
	}
	if err := applyOwned(ctx, r.Client, kvc, key(specs.PeerServiceName(kvc)), &corev1.Service{}, specs.PeerService(kvc, guard)); err != nil {
		return err
	}
	if err := applyOwned(ctx, r.Client, kvc, key(specs.ClientServiceName(kvc)), &corev1.Service{}, specs.ClientService(kvc, time.Time{})); err != nil {
		return err
	}
	if err := applyOwned(ctx, r.Client, kvc, key(kvc.Name), &policyv1.PodDisruptionBudget{}, specs.PodDisruptionBudget(kvc, ch.DisruptionBase)); err != nil {
		return err
	}
	if err := applyOwned(ctx, r.Client, kvc, key(specs.MembershipConfigMapName(kvc)), &corev1.ConfigMap{},
		specs.MembershipConfigMap(kvc, ch.Membership, guard)); err != nil {
		return err
	}
	set := ch.Set
	set.Guard = guard
	if err := applyOwned(ctx, r.Client, kvc, key(kvc.Name), &appsv1.StatefulSet{}, specs.StatefulSet(kvc, set)); err != nil {
		return err
	}
	// After the members: a policy the API server refuses (a selector it finds invalid) is
	// reported, and holds up nothing else.
	if err := r.applyNetworkPolicy(ctx, kvc, guard); err != nil {
		return err
	}
	if !wantGuard {
		return r.deleteGuard(ctx, kvc.Namespace, kvc.Name, kvc.UID)
	}
	return nil
}

// applyNetworkPolicy keeps the cluster's NetworkPolicy (spec.networkPolicy mode Managed), or
// deletes the one it made once the spec no longer wants it. A policy of the same name that is
// someone else's is never touched.
func (r *KVClusterReconciler) applyNetworkPolicy(ctx context.Context, kvc *kvv1.KVCluster, guard types.UID) error {
	key := client.ObjectKey{Namespace: kvc.Namespace, Name: specs.NetworkPolicyName(kvc)}
	if specs.WantsNetworkPolicy(kvc) {
		return applyOwned(ctx, r.Client, kvc, key, &networkingv1.NetworkPolicy{}, specs.NetworkPolicy(kvc, r.Operator, guard))
	}
	var np networkingv1.NetworkPolicy
	switch err := r.Client.Get(ctx, key, &np); {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return err
	}
	if !controlledBy(&np, kvc) || np.DeletionTimestamp != nil {
		return nil
	}
	if err := ignoreGone(r.Client.Delete(ctx, &np, client.Preconditions{UID: &np.UID})); err != nil {
		return fmt.Errorf("delete NetworkPolicy %s: %w", key, err)
	}
	r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, plan.EventNetworkPolicyDeleted, "DeleteNetworkPolicy",
		"deleted NetworkPolicy %s: spec.networkPolicy no longer asks for it, so the members admit any traffic the cluster's network allows", key.Name)
	return nil
}

// applyTLS keeps the cluster's TLS Secrets (mode Operator), issuing what the plan says: the CA
// first, then each certificate from it. A Secret is applied whole, with the data it holds, so a
// new owner (the guard) never drops its keys.
func (r *KVClusterReconciler) applyTLS(ctx context.Context, kvc *kvv1.KVCluster, tls plan.TLS, guard types.UID, now time.Time) error {
	var ca, previous certs.CA
	var trust []byte // what the CA Secret says to trust: both CAs while a rotation runs
	for _, part := range tls.Parts {
		data := part.Data
		switch {
		case part.Part == specs.TLSCA && part.Issue:
			var err error
			if ca, err = certs.NewCA("kvcluster-ca."+kvc.Name+"."+kvc.Namespace, now, plan.CAValidity); err != nil {
				return fmt.Errorf("create the CA of KVCluster %s/%s: %w", kvc.Namespace, kvc.Name, err)
			}
			data = map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM, specs.CACertKey: ca.CertPEM,
				specs.RotatedForKey: []byte(tls.Token)}
			if part.Rotate { // trusted together with the CA it replaces, until every certificate is the new one's
				old, oldKey := part.Data[corev1.TLSCertKey], part.Data[corev1.TLSPrivateKeyKey]
				data[specs.PreviousCAKey], data[specs.PreviousCAKeyKey] = old, oldKey
				data[specs.CACertKey] = append(append([]byte{}, old...), ca.CertPEM...)
			}
			if previous, err = certs.ParseCA(data[specs.PreviousCAKey], data[specs.PreviousCAKeyKey]); err != nil {
				previous = certs.CA{} // no rotation runs
			}
		case part.Part == specs.TLSCA:
			var err error
			if ca, err = certs.ParseCA(data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey]); err != nil {
				return fmt.Errorf("the CA of KVCluster %s/%s: %w", kvc.Namespace, kvc.Name, err)
			}
			if previous, err = certs.ParseCA(data[specs.PreviousCAKey], data[specs.PreviousCAKeyKey]); err != nil {
				previous = certs.CA{} // no rotation runs
			}
		case !part.Issue:
			// Deleted since it was observed (the cache shows it gone): a certificate someone deleted,
			// maybe because its key leaked, never comes back with that key.
			// Asked of the API server too: one created a moment ago may not be in the cache yet.
			if found, err := r.lookup(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.TLSSecretName(kvc, part.Part)}, &corev1.Secret{}); err != nil {
				return err
			} else if !found {
				// While a rotation runs, by the CA being replaced: every member trusts it throughout.
				part.Issue, part.ByPrevious, part.Why = true, previous.Cert != nil, "its Secret was deleted"
			}
		}
		if part.Part == specs.TLSCA {
			if trust = data[specs.CACertKey]; len(trust) == 0 {
				trust = ca.CertPEM
			}
		}
		if part.Issue && part.Part != specs.TLSCA {
			issuer := ca
			if part.ByPrevious {
				if previous.Cert == nil { // never fall back to a CA the members may not trust yet
					return fmt.Errorf("the %s certificate of KVCluster %s/%s must be issued by the CA being replaced, which Secret %s no longer holds",
						part.Part, kvc.Namespace, kvc.Name, specs.TLSSecretName(kvc, specs.TLSCA))
				}
				issuer = previous
			}
			leaf, err := issuer.Issue(part.Usage, part.Names, now, plan.LeafValidity)
			if err != nil {
				return fmt.Errorf("issue the %s certificate of KVCluster %s/%s: %w", part.Part, kvc.Namespace, kvc.Name, err)
			}
			data = map[string][]byte{corev1.TLSCertKey: leaf.CertPEM, corev1.TLSPrivateKeyKey: leaf.KeyPEM, specs.CACertKey: trust}
		}
		name := specs.TLSSecretName(kvc, part.Part)
		if err := applyOwned(ctx, r.Client, kvc, client.ObjectKey{Namespace: kvc.Namespace, Name: name}, &corev1.Secret{},
			specs.TLSSecret(kvc, part.Part, data, guard)); err != nil {
			return err
		}
		switch {
		case part.Issue:
			// The Secret is the related object, so each certificate's event stands on its own (see memberPod).
			secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kvc.Namespace}}
			r.Recorder.Eventf(kvc, secret, corev1.EventTypeNormal, plan.EventCertificateIssued, "Certificates",
				"issued the %s certificate in Secret %s: %s", part.Part, name, part.Why)
		case part.Part == specs.TLSCA && part.Why != "":
			r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, plan.EventCARotated, "Certificates",
				"members trust only the new CA from now on (%s); they restart once more", part.Why)
		}
	}
	return nil
}

// applyGuard keeps the cluster's deletion guard and returns its UID. It is owned by no one on
// purpose (foreignChildren checks the cluster UID it carries), so applyOwned does not fit it.
func (r *KVClusterReconciler) applyGuard(ctx context.Context, kvc *kvv1.KVCluster) (types.UID, error) {
	var guard corev1.ConfigMap
	key := client.ObjectKey{Namespace: kvc.Namespace, Name: specs.GuardName(kvc)}
	switch err := r.Client.Get(ctx, key, &guard); {
	case err == nil:
		if holdsIntent(&guard, specs.Guard(kvc)) {
			return guard.UID, nil
		}
	case !apierrors.IsNotFound(err):
		return "", fmt.Errorf("get ConfigMap %s: %w", key, err)
	}
	applied := specs.Guard(kvc)
	if err := r.Client.Apply(ctx, applied, client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
		return "", fmt.Errorf("apply the deletion guard %s: %w", key, err)
	}
	if applied.UID != nil { // the server's answer is decoded into the apply configuration
		return *applied.UID, nil
	}
	if err := r.APIReader.Get(ctx, key, &guard); err != nil {
		return "", fmt.Errorf("get ConfigMap %s: %w", key, err)
	}
	return guard.UID, nil
}

// deleteGuard lets the garbage collector remove the cluster's objects. It deletes only the guard
// of this incarnation (any, when uid is empty), and never one that keeps members orphaned on
// purpose (kubectl delete --cascade=orphan): a guard is a second owner of the members.
func (r *KVClusterReconciler) deleteGuard(ctx context.Context, namespace, name string, uid types.UID) error {
	var guard corev1.ConfigMap
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: specs.GuardNameOf(name)}, &guard); {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return err
	}
	if guard.Labels[specs.GuardLabel] != "true" || guard.Annotations[specs.OrphanedAnnotation] == "true" ||
		(uid != "" && guard.Labels[specs.ClusterUIDLabel] != string(uid)) {
		return nil
	}
	err := r.Client.Delete(ctx, &guard, client.Preconditions{UID: &guard.UID})
	if err := ignoreGone(err); err != nil {
		return fmt.Errorf("delete the deletion guard %s/%s: %w", namespace, guard.Name, err)
	}
	return nil
}

// rolloutStep carries out one rollout step and announces it. It reports whether it changed
// anything. Deletions carry the UID the decision was made on, so a decision taken on a stale cache
// can never delete a pod (or volume) that has already been replaced.
func (r *KVClusterReconciler) rolloutStep(ctx context.Context, kvc *kvv1.KVCluster, etcd members.Client, ro plan.Rollout, endpoints []string, view *members.Cluster) (bool, error) {
	name := specs.MemberName(kvc, ro.Ordinal)
	switch ro.Action {
	case plan.ActWait:
		return false, nil

	case plan.ActPreUpgradeBackup:
		if old := ro.OldJob; old != nil { // an earlier upgrade's: make room for this one's
			err := r.Client.Delete(ctx, old, client.PropagationPolicy(metav1.DeletePropagationBackground), client.Preconditions{UID: &old.UID})
			return true, ignoreGone(err)
		}
		// Its object's name has the time in it: a Job created a moment ago, not in the cache yet,
		// must not be applied again (its template is immutable).
		if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.PreUpgradeBackupJobName(kvc)}, &batchv1.Job{}); err == nil {
			return false, nil
		}
		if err := r.Client.Apply(ctx, ro.Job, client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
			return false, fmt.Errorf("apply pre-upgrade backup Job: %w", err)
		}

	case plan.ActRestartPod:
		if err := r.deletePod(ctx, kvc, name, ro.PodUID); err != nil {
			return false, err
		}

	case plan.ActMoveLeader:
		if err := etcd.MoveLeader(ctx, ro.Endpoint, ro.To); err != nil {
			return r.etcdRefused(ctx, kvc, ro, err)
		}

	case plan.ActAddLearner:
		if _, err := etcd.AddLearner(ctx, endpoints, ro.PeerURL); err != nil {
			return r.etcdRefused(ctx, kvc, ro, err)
		}

	case plan.ActPromote:
		err := etcd.Promote(ctx, endpoints, ro.MemberID)
		if errors.Is(err, members.ErrLearnerNotReady) {
			return false, nil // etcd says it is still behind; look again soon
		}
		if err != nil {
			return r.etcdRefused(ctx, kvc, ro, err)
		}

	case plan.ActRemove:
		// Through the other members: the one being removed answers "server stopped" even on success.
		others := make([]string, 0, len(endpoints))
		for _, u := range endpoints {
			if u != ro.Endpoint {
				others = append(others, u)
			}
		}
		// A member that lost its data: its new volume first. Should the removal then fail, the
		// member is still listed, and the pod the StatefulSet makes again (which takes the
		// identity again) has it decided anew; reset after the removal, a failed reset would
		// leave nothing that says this volume is to be reset.
		if ro.VolumeUID != "" {
			if err := r.resetVolume(ctx, kvc, ro); err != nil {
				return false, err
			}
			r.Recorder.Eventf(kvc, memberPod(kvc, name), corev1.EventTypeNormal, plan.EventMemberVolumeReset, ro.Reason,
				"reset the new volume of member %s (claim uid %s), on which etcd took the identity of the member being removed", name, ro.VolumeUID)
		}
		if err := etcd.Remove(ctx, others, ro.MemberID); err != nil {
			return r.etcdRefused(ctx, kvc, ro, err)
		}

	case plan.ActUpdatePeerURL:
		if err := etcd.UpdatePeerURL(ctx, endpoints, ro.MemberID, ro.PeerURL); err != nil {
			return r.etcdRefused(ctx, kvc, ro, err)
		}

	case plan.ActWipeLearner:
		// Only the volume of a learner that never started holds nothing the cluster needs.
		if !unstartedLearner(view, ro.MemberID) {
			return false, fmt.Errorf("refusing to reset the volume of %s: etcd member %x is not a learner that has not started", name, ro.MemberID)
		}
		if err := r.resetVolume(ctx, kvc, ro); err != nil {
			return false, err
		}
	}
	log.FromContext(ctx).Info("rollout step", "action", ro.Action.Event(), "member", name, "message", ro.Message)
	var related runtime.Object
	if ro.Action != plan.ActPreUpgradeBackup {
		related = memberPod(kvc, name)
	}
	r.Recorder.Eventf(kvc, related, corev1.EventTypeNormal, ro.Action.Event(), ro.Reason, "%s", ro.Message)
	return true, nil
}

// resetVolume deletes the member's data claim the rollout was decided on and its pod: the
// StatefulSet makes both again, the claim empty.
func (r *KVClusterReconciler) resetVolume(ctx context.Context, kvc *kvv1.KVCluster, ro plan.Rollout) error {
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: kvc.Namespace, Name: specs.DataClaimName(kvc, ro.Ordinal)}}
	if uid := ro.VolumeUID; uid != "" {
		if err := ignoreGone(r.Client.Delete(ctx, claim, client.Preconditions{UID: &uid})); err != nil {
			return fmt.Errorf("delete volume claim %s: %w", claim.Name, err)
		}
	}
	return r.deletePod(ctx, kvc, specs.MemberName(kvc, ro.Ordinal), ro.PodUID)
}

// memberPod names a member's pod, the related object of an event about the member: events of one
// reason and action about the same objects are folded into one series for minutes, keeping the
// first message only, so steps on different members would show as one.
func memberPod(kvc *kvv1.KVCluster, name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kvc.Namespace}}
}

// unstartedLearner: etcd still reports the member as a learner that never started. Checked again
// right before a volume is reset, whatever the plan said.
func unstartedLearner(c *members.Cluster, id uint64) bool {
	if c == nil {
		return false
	}
	for _, m := range c.Members {
		if m.ID == id {
			return m.Learner && !m.Started()
		}
	}
	return false
}

func (r *KVClusterReconciler) deletePod(ctx context.Context, kvc *kvv1.KVCluster, name string, uid types.UID) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: kvc.Namespace, Name: name}}
	if err := ignoreGone(r.Client.Delete(ctx, pod, client.Preconditions{UID: &uid})); err != nil {
		return fmt.Errorf("delete pod %s/%s: %w", kvc.Namespace, name, err)
	}
	return nil
}

// etcdRefused reports a membership request etcd refused as a warning; the next reconcile decides
// again from what etcd then reports, so it is not retried blindly. etcd's refusal right after a
// member restarted is expected, and only logged.
func (r *KVClusterReconciler) etcdRefused(ctx context.Context, kvc *kvv1.KVCluster, ro plan.Rollout, err error) (bool, error) {
	if errors.Is(err, members.ErrNotNow) {
		log.FromContext(ctx).Info("etcd refused a membership change for now; trying again", "step", ro.Message, "error", err.Error())
		return false, nil
	}
	r.Recorder.Eventf(kvc, memberPod(kvc, specs.MemberName(kvc, ro.Ordinal)), corev1.EventTypeWarning, plan.EventMembershipChangeFailed, ro.Reason, "%s: etcd refused: %v", ro.Message, err)
	return false, nil
}

// ignoreGone treats an object already deleted, or already replaced by a new one, as done.
func ignoreGone(err error) error {
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// disarm clears the stale alarms the plan names; one etcd does not clear yet is tried again on
// the next reconcile. It reports whether there were any.
func (r *KVClusterReconciler) disarm(ctx context.Context, kvc *kvv1.KVCluster, etcd members.Client, alarms []members.Alarm, endpoints []string) bool {
	for _, a := range alarms {
		if err := etcd.DisarmAlarm(ctx, endpoints, a); err != nil {
			log.FromContext(ctx).Info("cannot disarm a stale alarm yet", "alarm", a.Type, "member", fmt.Sprintf("%x", a.MemberID), "error", err.Error())
			return false
		}
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, plan.EventStaleAlarmDisarmed, "Disarm",
			"disarmed the %s alarm of member %x, which came with the restored snapshot", a.Type, a.MemberID)
	}
	return len(alarms) > 0
}

// freeSpace takes the plan's step of freeing space: a compaction, one member's defragmentation
// (under a NOSPACE alarm or in routine operation), or disarming the alarm. It reports the
// revision compacted to (also when etcd had compacted it already) and the member defragmented,
// which the cluster is planned again with, so status records them (see plan.FreeSpace), and
// whether it disarmed. A step etcd refuses is announced and planned again next time.
func (r *KVClusterReconciler) freeSpace(ctx context.Context, kvc *kvv1.KVCluster, etcd members.Client, step plan.FreeSpace, endpoints []string) (compactedTo int64, defragmented string, disarmed bool) {
	failed := func(what string, err error) (int64, string, bool) {
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, plan.EventFreeSpaceFailed, "FreeSpace", "%s: %v", what, err)
		return 0, "", false
	}
	switch {
	case step.CompactTo > 0:
		compacted, err := etcd.Compact(ctx, endpoints, step.CompactTo)
		if err != nil {
			return failed(fmt.Sprintf("compacting to revision %d", step.CompactTo), err)
		}
		if compacted {
			r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, plan.EventSpaceCompacted, "Compact",
				"compacted every revision before %d away to free space under the NOSPACE alarm (the latest value of every key is kept)", step.CompactTo)
		}
		return step.CompactTo, "", false
	case step.Defragment != "":
		start := r.Clock.Now()
		if err := etcd.Defragment(ctx, step.Endpoint); err != nil {
			return failed("defragmenting "+step.Defragment, err)
		}
		// The action says why: a routine defragmentation and one under the alarm are not folded
		// into one series (see memberPod).
		action, why := "FreeSpace", "under the NOSPACE alarm"
		switch {
		case step.Requested != "":
			action, why = "Defragment", fmt.Sprintf("asked for with %s=%s", kvv1.AnnotationDefragmentNow, step.Requested)
		case !step.Active:
			action, why = "Defragment", "in routine operation (spec.space.defragmentation)"
		}
		member := step.Defragment
		if step.Leader {
			member += " (the leader)"
		}
		r.Recorder.Eventf(kvc, memberPod(kvc, step.Defragment), corev1.EventTypeNormal, plan.EventMemberDefragmented, action,
			"defragmented %s in %s %s, returning its free pages to the disk (it served no request meanwhile)", member, r.Clock.Since(start).Round(time.Millisecond), why)
		return 0, step.Defragment, false
	case len(step.Disarm) > 0:
		for _, a := range step.Disarm {
			if err := etcd.DisarmAlarm(ctx, endpoints, a); err != nil {
				return failed("disarming the NOSPACE alarm", err)
			}
		}
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, plan.EventNoSpaceDisarmed, "Disarm",
			"disarmed the NOSPACE alarm: every database is below %d%% of the quota, and the cluster takes writes again", plan.NearQuotaPercent)
		return 0, "", true
	}
	return 0, "", false
}

// backupJobs starts the backup due now and deletes the Jobs beyond the history limits.
func (r *KVClusterReconciler) backupJobs(ctx context.Context, kvc *kvv1.KVCluster, b plan.Backups) error {
	if b.Start != nil {
		// A Job created a moment ago may not be in the cache yet: it is never applied again (its
		// template is immutable, and the members' scheme may have changed since).
		err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: *b.Start.Name}, &batchv1.Job{})
		switch {
		case apierrors.IsNotFound(err):
			if err := r.Client.Apply(ctx, b.Start, client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
				return fmt.Errorf("apply backup Job %s/%s: %w", kvc.Namespace, *b.Start.Name, err)
			}
			r.record(kvc, b.Started)
		case err != nil:
			return fmt.Errorf("look for backup Job %s/%s: %w", kvc.Namespace, *b.Start.Name, err)
		}
	}
	for _, job := range b.Prune {
		if err := r.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete old backup Job %s/%s: %w", job.Namespace, job.Name, err)
		}
	}
	return nil
}
