package controllers

import (
	"context"
	"errors"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// observe reads what Kubernetes (from the cache) and etcd (live) say about the cluster.
func (r *KVClusterReconciler) observe(ctx context.Context, kvc *kvv1.KVCluster) (observation, error) {
	obs := observation{pods: map[int]podInfo{}}
	var sts appsv1.StatefulSet
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: kvc.Name}, &sts); {
	case err == nil:
		obs.stsClaimsUnlabelled = len(sts.Spec.VolumeClaimTemplates) > 0 && sts.Spec.VolumeClaimTemplates[0].Labels[specs.ClusterUIDLabel] == ""
		obs.readyMembers = sts.Status.ReadyReplicas
		obs.stsReplicas = sts.Spec.Replicas
		obs.stsSettled = sts.Status.ObservedGeneration >= sts.Generation && sts.Status.UpdateRevision != ""
	case !apierrors.IsNotFound(err):
		return obs, fmt.Errorf("get StatefulSet %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}

	inCluster := []client.ListOption{client.InNamespace(kvc.Namespace), client.MatchingLabels{specs.ClusterLabel: kvc.Name}}
	var claims corev1.PersistentVolumeClaimList
	if err := r.Client.List(ctx, &claims, inCluster...); err != nil {
		return obs, fmt.Errorf("list volume claims of %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	claimUIDs := map[string]types.UID{}
	for _, c := range claims.Items {
		if c.DeletionTimestamp == nil {
			claimUIDs[c.Name] = c.UID
		}
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, inCluster...); err != nil {
		return obs, fmt.Errorf("list pods of %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		ord, ok := specs.OrdinalOfMember(kvc, pod.Name)
		if !ok || pod.Labels[appsv1.StatefulSetRevisionLabel] == "" {
			continue // not a member pod (a backup Job's, say)
		}
		info := podInfo{
			uid:         pod.UID,
			terminating: pod.DeletionTimestamp != nil,
			outdated:    obs.stsSettled && pod.Labels[appsv1.StatefulSetRevisionLabel] != sts.Status.UpdateRevision,
			volumeUID:   claimUIDs[specs.DataClaimName(kvc, ord)],
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady {
				info.ready = c.Status == corev1.ConditionTrue
			}
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Name == "etcd" {
				info.restarts = cs.RestartCount
			}
		}
		obs.pods[ord] = info
	}

	var cm corev1.ConfigMap
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.MembershipConfigMapName(kvc)}, &cm); {
	case err == nil:
		if m, ok := specs.ParseMembership(kvc, cm.Data); ok {
			obs.membership = &m
		}
	case !apierrors.IsNotFound(err):
		return obs, fmt.Errorf("get ConfigMap %s/%s: %w", kvc.Namespace, cm.Name, err)
	}

	var job batchv1.Job
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.PreUpgradeBackupJobName(kvc)}, &job); {
	case err == nil:
		obs.preUpgradeJob = &job
		if job.Annotations[specs.TargetVersionAnnotation] == kvc.Spec.Version {
			obs.preUpgradeBackup = stateOf(&job)
		}
	case !apierrors.IsNotFound(err):
		return obs, fmt.Errorf("get Job %s/%s: %w", kvc.Namespace, specs.PreUpgradeBackupJobName(kvc), err)
	}

	if sts.Status.Replicas == 0 && len(obs.pods) == 0 {
		obs.etcdErr = fmt.Errorf("no member pods exist yet")
		return obs, nil
	}
	cluster, err := r.Members.Cluster(ctx, clientURLs(kvc, obs), func(m members.Member) (string, bool) {
		ord, ok := memberOrdinal(kvc, m)
		return specs.MemberClientURL(kvc, ord), ok
	})
	if err != nil {
		obs.etcdErr = err
		return obs, nil
	}
	obs.cluster = &cluster
	return obs, nil
}

// clientURLs are the members to ask: the spec's, and any other member pod that exists.
func clientURLs(kvc *kvv1.KVCluster, obs observation) []string {
	urls := specs.MemberClientURLs(kvc)
	for ord := range obs.pods {
		if ord >= int(kvc.Spec.Partitions) {
			urls = append(urls, specs.MemberClientURL(kvc, ord))
		}
	}
	return urls
}

// act carries out one rollout step and announces it. It reports whether it changed anything.
// Deletions carry the UID the decision was made on, so a decision taken on a stale cache can never
// delete a pod (or volume) that has already been replaced.
func (r *KVClusterReconciler) act(ctx context.Context, kvc *kvv1.KVCluster, obs observation, ro rollout) (bool, error) {
	name := specs.MemberName(kvc, ro.ordinal)
	var eventReason string
	switch ro.action {
	case actWait:
		return false, nil

	case actPreUpgradeBackup:
		if old := obs.preUpgradeJob; old != nil { // an earlier upgrade's: make room for this one's
			err := r.Client.Delete(ctx, old, client.PropagationPolicy(metav1.DeletePropagationBackground), client.Preconditions{UID: &old.UID})
			return true, ignoreGone(err)
		}
		// Its object's name has the time in it: a Job created a moment ago, not in the cache yet,
		// must not be applied again (its template is immutable).
		if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.PreUpgradeBackupJobName(kvc)}, &batchv1.Job{}); err == nil {
			return false, nil
		}
		if err := r.Client.Apply(ctx, specs.PreUpgradeBackupJob(kvc, r.BackupImage, r.Clock.Now()), client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
			return false, fmt.Errorf("apply pre-upgrade backup Job: %w", err)
		}
		eventReason = "PreUpgradeBackupStarted"

	case actRestartPod:
		if err := r.deletePod(ctx, kvc, name, ro); err != nil {
			return false, err
		}
		eventReason = "MemberRestarted"

	case actMoveLeader:
		if err := r.Members.MoveLeader(ctx, specs.MemberClientURL(kvc, ro.ordinal), ro.to); err != nil {
			return r.etcdRefused(ctx, kvc, ro, err)
		}
		eventReason = "LeaderMoved"

	case actAddLearner:
		if _, err := r.Members.AddLearner(ctx, clientURLs(kvc, obs), specs.MemberPeerURL(kvc, ro.ordinal)); err != nil {
			return r.etcdRefused(ctx, kvc, ro, err)
		}
		eventReason = "MemberAdded"

	case actPromote:
		err := r.Members.Promote(ctx, clientURLs(kvc, obs), ro.memberID)
		if errors.Is(err, members.ErrLearnerNotReady) {
			return false, nil // etcd says it is still behind; look again soon
		}
		if err != nil {
			return r.etcdRefused(ctx, kvc, ro, err)
		}
		eventReason = "MemberPromoted"

	case actRemove:
		// Through the other members: the one being removed answers "server stopped" even on success.
		others := make([]string, 0, len(obs.pods))
		for _, u := range clientURLs(kvc, obs) {
			if u != specs.MemberClientURL(kvc, ro.ordinal) {
				others = append(others, u)
			}
		}
		if err := r.Members.Remove(ctx, others, ro.memberID); err != nil {
			return r.etcdRefused(ctx, kvc, ro, err)
		}
		eventReason = "MemberRemoved"

	case actWipeLearner:
		// Only the volume of a learner that never started holds nothing the cluster needs.
		if !unstartedLearner(obs.cluster, ro.memberID) {
			return false, fmt.Errorf("refusing to reset the volume of %s: etcd member %x is not a learner that has not started", name, ro.memberID)
		}
		claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: kvc.Namespace, Name: specs.DataClaimName(kvc, ro.ordinal)}}
		if uid := obs.pods[ro.ordinal].volumeUID; uid != "" {
			if err := ignoreGone(r.Client.Delete(ctx, claim, client.Preconditions{UID: &uid})); err != nil {
				return false, fmt.Errorf("delete volume claim %s: %w", claim.Name, err)
			}
		}
		if err := r.deletePod(ctx, kvc, name, ro); err != nil {
			return false, err
		}
		eventReason = "MemberVolumeReset"
	}
	log.FromContext(ctx).Info("rollout step", "action", eventReason, "member", name, "message", ro.message)
	r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, eventReason, ro.reason, "%s", ro.message)
	return true, nil
}

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

func (r *KVClusterReconciler) deletePod(ctx context.Context, kvc *kvv1.KVCluster, name string, ro rollout) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: kvc.Namespace, Name: name}}
	if err := ignoreGone(r.Client.Delete(ctx, pod, client.Preconditions{UID: &ro.podUID})); err != nil {
		return fmt.Errorf("delete pod %s/%s: %w", kvc.Namespace, name, err)
	}
	return nil
}

// etcdRefused reports a membership request etcd refused as a warning; the next reconcile decides
// again from what etcd then reports, so it is not retried blindly. etcd's refusal right after a
// member restarted is expected, and only logged.
func (r *KVClusterReconciler) etcdRefused(ctx context.Context, kvc *kvv1.KVCluster, ro rollout, err error) (bool, error) {
	if errors.Is(err, members.ErrNotNow) {
		log.FromContext(ctx).Info("etcd refused a membership change for now; trying again", "step", ro.message, "error", err.Error())
		return false, nil
	}
	r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, "MembershipChangeFailed", ro.reason, "%s: etcd refused: %v", ro.message, err)
	return false, nil
}

// ignoreGone treats an object already deleted, or already replaced by a new one, as done.
func ignoreGone(err error) error {
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

func stateOf(job *batchv1.Job) jobState {
	switch done, succeeded, _ := jobOutcome(job); {
	case !done:
		return jobRunning
	case succeeded:
		return jobSucceeded
	default:
		return jobFailed
	}
}
