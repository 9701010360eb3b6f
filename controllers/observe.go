package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// observe reads, once per reconcile and before anything is decided, what Kubernetes (from the
// cache; from the API server only what the cache cannot hold) and etcd (live) say about the
// cluster. It writes nothing.
// It returns the client that speaks to the cluster's members (with its client certificate when
// the cluster has TLS).
func (r *KVClusterReconciler) observe(ctx context.Context, kvc *kvv1.KVCluster) (plan.Observation, members.Client, error) {
	obs := plan.Observation{Pods: map[int]plan.Pod{}}
	etcd := r.Members
	var sts appsv1.StatefulSet
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: kvc.Name}, &sts); {
	case err == nil:
		statefulSetObserved(&sts, &obs)
	case !apierrors.IsNotFound(err):
		return obs, nil, fmt.Errorf("get StatefulSet %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	if err := r.observePods(ctx, kvc, &sts, &obs); err != nil {
		return obs, nil, err
	}

	var cm corev1.ConfigMap
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.MembershipConfigMapName(kvc)}, &cm); {
	case err == nil:
		if m, ok := specs.ParseMembership(kvc, cm.Data); ok {
			obs.Membership = &m
		}
	case !apierrors.IsNotFound(err):
		return obs, nil, fmt.Errorf("get ConfigMap %s/%s: %w", kvc.Namespace, cm.Name, err)
	}

	var err error
	if kvc.Spec.Backup != nil || kvc.Status.BackupRequest != nil {
		if obs.Jobs, obs.PreUpgradeJob, err = r.observeJobs(ctx, kvc); err != nil {
			return obs, nil, err
		}
		if obs.BackupRequestJobGone, err = r.backupRequestJobGone(ctx, kvc, obs.Jobs); err != nil {
			return obs, nil, err
		}
	}
	if obs.ForeignChildren, obs.STSForeign, err = r.foreignChildren(ctx, kvc); err != nil {
		return obs, nil, err
	}
	if obs.LeftoverClaims, err = r.leftoverClaims(ctx, kvc, obs); err != nil {
		return obs, nil, err
	}
	if obs.ExpandableClasses, err = r.expandableClasses(ctx, kvc, obs.Claims); err != nil {
		return obs, nil, err
	}
	if obs.MissingPodReferences, err = r.missingPodReferences(ctx, kvc, obs.Pods); err != nil {
		return obs, nil, err
	}

	if obs.TLS, err = r.observeTLS(ctx, kvc, "", &obs); err != nil {
		return obs, nil, err
	}
	if etcd, err = r.membersClient(kvc, obs.ClientScheme(kvc), obs.TLS); err != nil {
		obs.EtcdErr = err
		return obs, r.Members, nil
	}
	if sts.Status.Replicas == 0 && len(obs.Pods) == 0 {
		obs.EtcdErr = fmt.Errorf("no member pods exist yet")
		return obs, etcd, nil
	}
	scheme := obs.ClientScheme(kvc)
	endpoints := obs.AskableURLs(kvc)
	if len(endpoints) == 0 {
		obs.EtcdErr = fmt.Errorf("no member's etcd container is running")
		return obs, etcd, nil
	}
	cluster, err := etcd.Cluster(ctx, endpoints, func(m members.Member) (string, bool) {
		ord, ok := plan.MemberOrdinal(kvc, m)
		return specs.MemberClientURL(kvc, scheme, ord), ok && obs.Askable(ord)
	})
	if err != nil {
		obs.EtcdErr = err
		return obs, etcd, nil
	}
	obs.Cluster = &cluster
	return obs, etcd, nil
}

// statefulSetObserved is what observe reads of the cluster's StatefulSet (cachedIntent keeps it);
// observePods reads its status's updateRevision and replicas too.
func statefulSetObserved(sts *appsv1.StatefulSet, obs *plan.Observation) {
	if len(sts.Spec.VolumeClaimTemplates) > 0 {
		template := sts.Spec.VolumeClaimTemplates[0]
		obs.STSClaimsUnlabelled = template.Labels[specs.ClusterUIDLabel] == ""
		obs.STSClaimSize = template.Spec.Resources.Requests[corev1.ResourceStorage]
	}
	obs.STSReplicas = sts.Spec.Replicas
	obs.STSSettled = sts.Status.ObservedGeneration >= sts.Generation && sts.Status.UpdateRevision != ""
	obs.STSTrust = sts.Spec.Template.Annotations[specs.TrustAnnotation]
	obs.STSAwaitedPods = sts.Annotations[specs.AwaitedPodsAnnotation]
	if t, ok := specs.PodTransport(sts.Spec.Template.Spec); ok {
		obs.STSTransport = &t
	}
	obs.STSTLSSecrets = specs.PodTLSSecrets(sts.Spec.Template.Spec)
	obs.STSQuota, _ = specs.PodQuota(sts.Spec.Template.Spec)
}

// observeTLS reads the cluster's TLS Secrets: the operator's own (a Secret under their name that
// the cluster does not control is someone else's, never written), or those the spec names; and
// while a cluster moves back to plaintext, those its members and clients still use (only read:
// nothing is issued for it any more). In a foreground deletion the garbage
// collector takes the KVCluster off the owners of the Secrets its guard also owns: those are
// still the cluster's (guard is the guard's UID, or "").
func (r *KVClusterReconciler) observeTLS(ctx context.Context, kvc *kvv1.KVCluster, guard types.UID, obs *plan.Observation) (map[string]map[string][]byte, error) {
	if !specs.TLSEnabled(kvc) && !obs.UsesTLS() {
		return nil, nil
	}
	parts := []string{specs.TLSServer, specs.TLSPeer, specs.TLSClient}
	operator := specs.TLSEnabled(kvc) && kvc.Spec.TLS.Mode == kvv1.TLSOperator
	if operator {
		parts = append([]string{specs.TLSCA}, parts...)
	}
	out := map[string]map[string][]byte{}
	for _, part := range parts {
		var secret corev1.Secret
		name := specs.TLSSecretName(kvc, part)
		found, err := r.lookup(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: name}, &secret)
		if err != nil || !found {
			if err != nil {
				return nil, err
			}
			continue
		}
		if operator && !controlledBy(&secret, kvc) && (guard == "" || !ownedBy(&secret, guard)) {
			obs.ForeignChildren = append(obs.ForeignChildren, "Secret "+name+" ("+ownerOf(&secret)+")")
			continue
		}
		out[part] = secret.Data
	}
	return out, nil
}

// membersClient is the client that speaks to the cluster's members in scheme: over https with
// the client certificate of its TLS Secrets (secrets, as observeTLS read them), with the sessions
// kept for the cluster while they stay the same, so connections resume them.
func (r *KVClusterReconciler) membersClient(kvc *kvv1.KVCluster, scheme string, secrets map[string]map[string][]byte) (members.Client, error) {
	cluster := types.NamespacedName{Namespace: kvc.Namespace, Name: kvc.Name}
	if scheme != "https" {
		r.clientTLS.Forget(cluster)
		return r.Members, nil
	}
	c := secrets[specs.TLSClient]
	config, err := r.clientTLS.Of(cluster, c[specs.CACertKey], c[corev1.TLSCertKey], c[corev1.TLSPrivateKeyKey], secrets[specs.TLSServer][corev1.TLSCertKey])
	if err != nil {
		return nil, fmt.Errorf("no usable client certificate in Secret %s yet: %w", specs.TLSSecretName(kvc, specs.TLSClient), err)
	}
	return r.Members.WithTLS(config), nil
}

// observePods reads the member pods and the data claims they run on.
func (r *KVClusterReconciler) observePods(ctx context.Context, kvc *kvv1.KVCluster, sts *appsv1.StatefulSet, obs *plan.Observation) error {
	inCluster := []client.ListOption{client.InNamespace(kvc.Namespace), ofCluster(kvc)}
	var claims corev1.PersistentVolumeClaimList
	if err := r.Client.List(ctx, &claims, inCluster...); err != nil {
		return fmt.Errorf("list volume claims of %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	claimUIDs := map[string]types.UID{}
	claimsDeletedAt := map[string]time.Time{}
	obs.Claims = map[int]plan.Claim{} // a deletion's observation is made without one
	for _, c := range claims.Items {
		claimUIDs[c.Name] = c.UID
		if c.DeletionTimestamp != nil {
			claimsDeletedAt[c.Name] = c.DeletionTimestamp.Time
			if ord, ok := specs.OrdinalOfClaim(kvc, c.Name); ok {
				obs.ClaimsBeingDeleted = append(obs.ClaimsBeingDeleted, ord)
			}
			continue
		}
		if ord, ok := specs.OrdinalOfClaim(kvc, c.Name); ok {
			obs.Claims[ord] = claimObserved(&c)
		}
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, inCluster...); err != nil {
		return fmt.Errorf("list pods of %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		ord, ok := specs.OrdinalOfMember(kvc, pod.Name)
		if !ok || !isMemberPod(pod) {
			continue // not a member pod (a backup Job's, say)
		}
		state := memberPodStateOf(pod)
		claim := specs.DataClaimName(kvc, ord)
		volume := claimUIDs[claim]
		// A pod runs on its claim until it stops, even on one being deleted: a member seen healthy
		// there is recorded on it, so that once the claim is gone and the pod is back on a new,
		// empty one, the lost data is recognised. The StatefulSet controller makes no pod for a
		// claim it sees being deleted (and the old pod's stop outlasts its cache's lag), so a pod
		// made after the deletion began waits for a new claim: the claims seen may just be older
		// than the pods. Timestamps count whole seconds, and a claim is often reset in the second
		// its pod was made (the pod the reset was decided on): such a pod runs on it. One made
		// after the reset in that second, if the claims seen lag by the seconds its member takes
		// to join, is recorded on the old claim and again on the next look that finds it healthy;
		// unhealthy before that, its new claim would be taken for lost data and reset.
		if deletedAt, ok := claimsDeletedAt[claim]; ok && pod.CreationTimestamp.Time.After(deletedAt) {
			volume = ""
		}
		info := plan.Pod{
			UID:         pod.UID,
			Ready:       state.ready,
			Terminating: state.terminating,
			Running:     state.running,
			Restarts:    state.restarts,
			Outdated:    obs.STSSettled && state.revision != sts.Status.UpdateRevision,
			Created:     pod.CreationTimestamp.Time,
			VolumeUID:   volume,
		}
		if t, ok := specs.PodTransport(pod.Spec); ok {
			info.Transport = &t
		}
		obs.Pods[ord] = info
		if info.Ready && !info.Terminating && ord < int(kvc.Spec.Partitions) {
			obs.ReadyMembers++ // a pod scaled away does not stand in for a member that is down
		}
	}
	return nil
}

// isMemberPod: the pod was made by the cluster's StatefulSet (it carries a revision), so it runs
// a member, not a Job.
func isMemberPod(pod *corev1.Pod) bool {
	return pod.Labels[appsv1.StatefulSetRevisionLabel] != ""
}

// memberPodState is what the operator reads from a member pod; the pod watch triggers a
// reconcile when it changes (memberPodChanged).
type memberPodState struct {
	ready, running, terminating bool
	restarts                    int32  // of the etcd container
	revision                    string // the StatefulSet revision it was made from
}

func memberPodStateOf(pod *corev1.Pod) memberPodState {
	s := memberPodState{terminating: pod.DeletionTimestamp != nil, revision: pod.Labels[appsv1.StatefulSetRevisionLabel]}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			s.ready = c.Status == corev1.ConditionTrue && pod.Status.Phase == corev1.PodRunning
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == "etcd" {
			s.restarts = cs.RestartCount
			s.running = cs.State.Running != nil
		}
	}
	return s
}

// +kubebuilder:rbac:groups=storage.k8s.io,resources=storageclasses,verbs=get

// expandableClasses reads, for the StorageClass of each bound claim that asks for less than
// storage.size, whether it allows volume expansion. Only then: it is read from the API server
// (the cache holds no StorageClasses).
func (r *KVClusterReconciler) expandableClasses(ctx context.Context, kvc *kvv1.KVCluster, claims map[int]plan.Claim) (map[string]bool, error) {
	want := specs.StorageSize(kvc)
	out, read := map[string]bool{}, map[string]bool{}
	for _, c := range claims {
		if read[c.Class] || c.Class == "" || !c.Bound || c.Requested.Cmp(want) >= 0 {
			continue
		}
		read[c.Class] = true
		var class storagev1.StorageClass
		switch err := r.APIReader.Get(ctx, client.ObjectKey{Name: c.Class}, &class); {
		case err == nil:
			out[c.Class] = ptr.Deref(class.AllowVolumeExpansion, false)
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("get StorageClass %s: %w", c.Class, err)
		}
	}
	return out, nil
}

// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get
// +kubebuilder:rbac:groups=scheduling.k8s.io,resources=priorityclasses,verbs=get

// missingPodReferences are the ServiceAccount and PriorityClass spec.pods names that do not
// exist: the StatefulSet controller could not create a missing member pod, nor one restarted onto
// the new template. They are read (by name, on the API server) only while a member pod is missing
// or outdated.
func (r *KVClusterReconciler) missingPodReferences(ctx context.Context, kvc *kvv1.KVCluster, pods map[int]plan.Pod) ([]string, error) {
	wanting := false
	for ord := range int(kvc.Spec.Partitions) {
		p, ok := pods[ord]
		wanting = wanting || !ok || p.Outdated
	}
	if !wanting || (kvc.Spec.Pods.ServiceAccountName == "" && kvc.Spec.Pods.PriorityClassName == "") {
		return nil, nil
	}
	var missing []string
	check := func(kind string, key client.ObjectKey, obj client.Object) error {
		switch err := r.APIReader.Get(ctx, key, obj); {
		case apierrors.IsNotFound(err):
			missing = append(missing, kind+" "+key.Name)
		case err != nil:
			return fmt.Errorf("get %s %s: %w", kind, key.Name, err)
		}
		return nil
	}
	if name := kvc.Spec.Pods.ServiceAccountName; name != "" {
		if err := check("ServiceAccount", client.ObjectKey{Namespace: kvc.Namespace, Name: name}, &corev1.ServiceAccount{}); err != nil {
			return nil, err
		}
	}
	if name := kvc.Spec.Pods.PriorityClassName; name != "" {
		if err := check("PriorityClass", client.ObjectKey{Name: name}, &schedulingv1.PriorityClass{}); err != nil {
			return nil, err
		}
	}
	return missing, nil
}

// observeJobs reads the cluster's backup Jobs, sorted by name, with the report of the newest
// finished one, and the pre-upgrade backup Job among them.
func (r *KVClusterReconciler) observeJobs(ctx context.Context, kvc *kvv1.KVCluster) ([]plan.Job, *batchv1.Job, error) {
	var list batchv1.JobList
	if err := r.Client.List(ctx, &list, client.InNamespace(kvc.Namespace), ofCluster(kvc), client.HasLabels{specs.BackupKindLabel}); err != nil {
		return nil, nil, fmt.Errorf("list backup Jobs of %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	jobs := make([]plan.Job, 0, len(list.Items))
	var preUpgrade *batchv1.Job
	for i := range list.Items {
		jobs = append(jobs, plan.NewJob(&list.Items[i], ""))
		if list.Items[i].Name == specs.PreUpgradeBackupJobName(kvc) {
			preUpgrade = &list.Items[i]
		}
	}
	slices.SortFunc(jobs, func(a, b plan.Job) int { return strings.Compare(a.Job.Name, b.Job.Name) })
	// The reports read are the newest finished Job's and, until status.backupRequest holds its
	// outcome, that of the backup asked for with kvcluster.io/backup-now.
	if latest := plan.NewestFinished(jobs); latest != nil {
		report, err := r.jobReport(ctx, latest.Job, false)
		if err != nil {
			return nil, nil, err
		}
		latest.Report = report
	}
	// The request's outcome is recorded once: its report is read on the API server if the cache
	// does not hold it yet.
	token, req := kvc.Annotations[kvv1.AnnotationBackupNow], kvc.Status.BackupRequest
	if token == "" && req != nil && req.State == kvv1.BackupRequestRunning { // the annotation was removed
		token = req.Token
	}
	if token != "" {
		name := specs.OnDemandBackupJobName(kvc, token)
		if i := slices.IndexFunc(jobs, func(j plan.Job) bool { return j.Job.Name == name && j.Done && j.Report == "" }); i >= 0 &&
			(req == nil || req.Token != token || req.Backup == nil || req.Backup.Job != name) {
			report, err := r.jobReport(ctx, jobs[i].Job, true)
			if err != nil {
				return nil, nil, err
			}
			jobs[i].Report = report
		}
	}
	return jobs, preUpgrade, nil
}

// backupRequestJobGone says whether the Job status.backupRequest says is running is gone: not in
// jobs (the cache) nor on the API server.
func (r *KVClusterReconciler) backupRequestJobGone(ctx context.Context, kvc *kvv1.KVCluster, jobs []plan.Job) (bool, error) {
	req := kvc.Status.BackupRequest
	if req == nil || req.State != kvv1.BackupRequestRunning || req.Job == "" || slices.ContainsFunc(jobs, func(j plan.Job) bool { return j.Job.Name == req.Job }) {
		return false, nil
	}
	switch err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: req.Job}, &batchv1.Job{}); {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("get backup Job %s/%s: %w", kvc.Namespace, req.Job, err)
	}
	return false, nil
}

// jobReport is the termination message of a Job's pod (the backup program's result or error). Pods
// are matched by the Job's UID: an earlier Job of the same name may have left pods behind. A Job
// seen finished before its pod's final status reached the cache is read on the API server when
// fresh (a deletion step reads its report once; a scheduled backup's is read again later).
func (r *KVClusterReconciler) jobReport(ctx context.Context, job *batchv1.Job, fresh bool) (string, error) {
	readers := []client.Reader{r.Client}
	if fresh {
		readers = append(readers, r.APIReader)
	}
	return r.jobReportFrom(ctx, job, readers...)
}

// jobReportFrom is the report of a finished Job's pod, read from the first reader that has it.
func (r *KVClusterReconciler) jobReportFrom(ctx context.Context, job *batchv1.Job, readers ...client.Reader) (string, error) {
	for _, reader := range readers {
		var pods corev1.PodList
		if err := reader.List(ctx, &pods, client.InNamespace(job.Namespace), client.MatchingLabels{batchv1.ControllerUidLabel: string(job.UID)}); err != nil {
			return "", fmt.Errorf("list pods of Job %s/%s: %w", job.Namespace, job.Name, err)
		}
		if report := plan.TerminationMessage(pods.Items); report != "" {
			return report, nil
		}
	}
	return "", nil
}

// foreignChildren lists the objects the cluster would own that exist and belong to someone else:
// an unrelated Service named <name>-client, or what an earlier KVCluster of the same name left
// while the garbage collector removes it. None of them may be written.
// stsForeign says the StatefulSet is among them: what answers at the members' names is then
// someone else's, and is never backed up.
func (r *KVClusterReconciler) foreignChildren(ctx context.Context, kvc *kvv1.KVCluster) (foreign []string, stsForeign bool, err error) {
	type child struct {
		kind, name string
		obj        client.Object
	}
	children := []child{
		{"Service", specs.PeerServiceName(kvc), &corev1.Service{}},
		{"Service", specs.ClientServiceName(kvc), &corev1.Service{}},
		{"PodDisruptionBudget", kvc.Name, &policyv1.PodDisruptionBudget{}},
		{"ConfigMap", specs.MembershipConfigMapName(kvc), &corev1.ConfigMap{}},
		{"StatefulSet", kvc.Name, &appsv1.StatefulSet{}},
	}
	if specs.WantsNetworkPolicy(kvc) { // else a policy of that name may well be the user's own
		children = append(children, child{"NetworkPolicy", specs.NetworkPolicyName(kvc), &networkingv1.NetworkPolicy{}})
	}
	var guard corev1.ConfigMap // owned by no one on purpose: it names its cluster by UID
	// Only the cache is asked: a guard always carries the operator's labels.
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.GuardName(kvc)}, &guard); client.IgnoreNotFound(err) != nil {
		return nil, false, err
	} else if err == nil && guard.Labels[specs.ClusterUIDLabel] != string(kvc.UID) {
		foreign = append(foreign, "ConfigMap "+guard.Name+" (the deletion guard of another KVCluster, uid "+guard.Labels[specs.ClusterUIDLabel]+")")
	}
	for _, c := range children {
		found, err := r.lookup(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: c.name}, c.obj)
		if err != nil {
			return nil, false, err
		}
		if found && !controlledBy(c.obj, kvc) {
			foreign = append(foreign, c.kind+" "+c.name+" ("+ownerOf(c.obj)+")")
			stsForeign = stsForeign || c.kind == "StatefulSet"
		}
	}
	return foreign, stsForeign, nil
}

// claimObserved is what observe reads of a member's data claim (cachedForm keeps it).
func claimObserved(c *corev1.PersistentVolumeClaim) plan.Claim {
	claim := plan.Claim{Name: c.Name, UID: c.UID, Bound: c.Status.Phase == corev1.ClaimBound, Class: ptr.Deref(c.Spec.StorageClassName, ""),
		Requested: c.Spec.Resources.Requests[corev1.ResourceStorage], Capacity: c.Status.Capacity[corev1.ResourceStorage]}
	for _, cond := range c.Status.Conditions {
		if cond.Type == corev1.PersistentVolumeClaimFileSystemResizePending && cond.Status == corev1.ConditionTrue {
			claim.ResizePendingSince = cond.LastTransitionTime.Time
		}
	}
	return claim
}

// leftoverClaims lists the data claims, among those of every member the cluster has or may get,
// that exist and were not made for this KVCluster: volumes retained from an earlier cluster of
// the same name, or created by hand. The StatefulSet would adopt them and its members would start
// on their data (a restore would be skipped, since the member has data).
func (r *KVClusterReconciler) leftoverClaims(ctx context.Context, kvc *kvv1.KVCluster, obs plan.Observation) ([]string, error) {
	n := int(kvc.Spec.Partitions)
	if obs.STSReplicas != nil {
		n = max(n, int(*obs.STSReplicas))
	}
	for _, m := range kvc.Status.Members {
		if ord, ok := specs.OrdinalOfMember(kvc, m.Name); ok {
			n = max(n, ord+1)
		}
	}
	var leftover []string
	for ord := range n {
		var claim corev1.PersistentVolumeClaim
		found, err := r.lookup(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.DataClaimName(kvc, ord)}, &claim)
		if err != nil {
			return nil, err
		}
		// A claim being deleted is no risk: no new pod may use it, and the StatefulSet makes a new one.
		if found && claim.DeletionTimestamp == nil && !plan.ClaimBelongs(kvc, &claim) {
			leftover = append(leftover, claim.Name)
		}
	}
	return leftover, nil
}

// observeDeletion reads what a pass over a deleted cluster's steps needs: the KVCluster afresh
// (a cache lagging behind the last pass's status write would run a step again: drain and fence
// twice, announce twice), its namespace, guard, members, client Service and the steps' Jobs. It
// returns a nil KVCluster when it is gone.
func (r *KVClusterReconciler) observeDeletion(ctx context.Context, cached *kvv1.KVCluster) (*kvv1.KVCluster, plan.DeletionObservation, members.Client, error) {
	var obs plan.DeletionObservation
	kvc := &kvv1.KVCluster{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(cached), kvc); err != nil {
		return nil, obs, nil, client.IgnoreNotFound(err)
	}
	var err error
	if obs.NamespaceGone, err = r.namespaceTerminating(ctx, kvc.Namespace); err != nil {
		return nil, obs, nil, err
	}
	etcd := r.Members
	if obs.NamespaceGone {
		// Its members are going and no Job can start there: only a step's Job that finished
		// before is looked for.
		obs.Orphaning = slices.Contains(kvc.Finalizers, metav1.FinalizerOrphanDependents)
	} else if etcd, err = r.observeDeletionMembers(ctx, kvc, &obs); err != nil {
		return nil, obs, nil, err
	}
	obs.Jobs = map[string]plan.StepJob{}
	steps := map[kvv1.DeletionStepName]string{}
	if plan.WantsFinalBackup(kvc) {
		steps[kvv1.StepFinalBackup] = specs.FinalBackupJobName(kvc)
	}
	if kvc.Spec.Deregistration != nil {
		steps[kvv1.StepDeregistration] = specs.DeregistrationJobName(kvc)
	}
	for step, name := range steps {
		sj, found, err := r.observeStepJob(ctx, kvc, step, name, obs.NamespaceGone)
		if err != nil {
			return nil, obs, nil, err
		}
		if found {
			obs.Jobs[name] = sj
		}
	}
	return kvc, obs, etcd, nil
}

// observeDeletionMembers reads the guard, the members, their client Service and how to reach
// them, for a deletion whose namespace stays.
func (r *KVClusterReconciler) observeDeletionMembers(ctx context.Context, kvc *kvv1.KVCluster, obs *plan.DeletionObservation) (members.Client, error) {
	var guard corev1.ConfigMap
	if found, err := r.lookup(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.GuardName(kvc)}, &guard); err != nil {
		return nil, err
	} else if found && guard.Labels[specs.ClusterUIDLabel] == string(kvc.UID) {
		obs.Guard = guard.UID
	}
	// The fence speaks to the members with the cluster's client certificate; without a usable
	// one it fails, and the final backup goes on unfenced, saying so.
	pods := plan.Observation{Pods: map[int]plan.Pod{}}
	if err := r.observePods(ctx, kvc, &appsv1.StatefulSet{}, &pods); err != nil {
		return nil, err
	}
	secrets, err := r.observeTLS(ctx, kvc, obs.Guard, &pods)
	if err != nil {
		return nil, err
	}
	obs.ClientScheme = pods.ClientScheme(kvc)
	etcd, err := r.membersClient(kvc, obs.ClientScheme, secrets)
	if err != nil {
		etcd = r.Members
	}
	if obs.Orphaning, err = r.orphaning(ctx, kvc); err != nil {
		return nil, err
	}
	if obs.OwnMembers, err = r.hasOwnMembers(ctx, kvc, obs.Guard); err != nil {
		return nil, err
	}
	var svc corev1.Service
	found, err := r.lookup(ctx, client.ObjectKey{Namespace: kvc.Namespace, Name: specs.ClientServiceName(kvc)}, &svc)
	if err != nil {
		return nil, err
	}
	if at, err := time.Parse(time.RFC3339, svc.Annotations[specs.DrainedAtAnnotation]); found && err == nil {
		obs.DrainedAt = &at
	}
	obs.ClientServiceWritable = found && controlledBy(&svc, kvc) && svc.DeletionTimestamp == nil
	return etcd, nil
}

// observeStepJob reads a deletion step's Job, if it exists: whose it is and, once it is done
// while its step is not over, its report. In a namespace being deleted (gone) only a Job that
// finished counts (a running one goes with the namespace), and it is read on the API server: the
// cache of an operator started during the deletion holds nothing of the namespace, and what may
// not be read there (the Roles of an install that watches some namespaces go first) is taken as
// absent, a report that may not be read as none.
func (r *KVClusterReconciler) observeStepJob(ctx context.Context, kvc *kvv1.KVCluster, step kvv1.DeletionStepName, name string, gone bool) (plan.StepJob, bool, error) {
	job := &batchv1.Job{}
	key := client.ObjectKey{Namespace: kvc.Namespace, Name: name}
	readers := []client.Reader{r.Client, r.APIReader}
	found, err := false, error(nil)
	if gone {
		readers = readers[1:]
		switch err = r.APIReader.Get(ctx, key, job); {
		case err == nil:
			found = true
		case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
			err = nil
		default:
			err = fmt.Errorf("get Job %s: %w", key, err)
		}
	} else {
		found, err = r.lookup(ctx, key, job)
	}
	if err != nil || !found {
		return plan.StepJob{}, false, err
	}
	sj := plan.StepJob{Job: plan.NewJob(job, "")}
	if gone && !sj.Done {
		return plan.StepJob{}, false, nil
	}
	rec, _ := plan.FindStep(kvc.Status.Deletion, step)
	switch {
	case !controlledBy(job, kvc) && job.Labels[specs.ClusterUIDLabel] != string(kvc.UID):
		sj.NotOurs = ownerOf(job)
	case sj.Done && rec.Outcome != kvv1.DeletionSucceeded:
		// Read while its step is not over, on the API server too if the cache lags; a failed
		// step that blocks the deletion is decided again from it on every pass.
		report, err := r.jobReportFrom(ctx, job, readers...)
		if err != nil && !(gone && apierrors.IsForbidden(err)) {
			return plan.StepJob{}, false, err
		}
		sj.Report = report
	}
	return sj, true, nil
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

// namespaceTerminating: the cluster's namespace is being deleted, so its pods and claims are going
// and no Job can start there.
func (r *KVClusterReconciler) namespaceTerminating(ctx context.Context, name string) (bool, error) {
	var ns corev1.Namespace
	if err := r.APIReader.Get(ctx, client.ObjectKey{Name: name}, &ns); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return ns.DeletionTimestamp != nil, nil
}
