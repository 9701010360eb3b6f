package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/backup"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/members/memberstest"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

var errNoQuorum = errors.New("context deadline exceeded")

func (h *harness) namespace(prefix string) string {
	h.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := h.client.Create(context.Background(), ns); err != nil {
		h.t.Fatal(err)
	}
	return ns.Name
}

func newKVCluster(ns, name string, partitions int32) *kvv1.KVCluster {
	return &kvv1.KVCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       kvv1.KVClusterSpec{Version: "3.7.3", Partitions: partitions},
	}
}

func (h *harness) create(kvc *kvv1.KVCluster) {
	h.t.Helper()
	if err := h.client.Create(context.Background(), kvc); err != nil {
		h.t.Fatalf("create KVCluster: %v", err)
	}
}

func (h *harness) get(obj client.Object, ns, name string) {
	h.t.Helper()
	if err := h.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, obj); err != nil {
		h.t.Fatalf("get %T %s/%s: %v", obj, ns, name, err)
	}
}

func (h *harness) fresh(kvc *kvv1.KVCluster) *kvv1.KVCluster {
	h.t.Helper()
	out := &kvv1.KVCluster{}
	h.get(out, kvc.Namespace, kvc.Name)
	return out
}

// setMembersReady plays the kubelet and StatefulSet controller, which envtest does not run: the
// cluster's member pods exist, the first ready of them Ready, and the StatefulSet's status says so.
func (h *harness) setMembersReady(kvc *kvv1.KVCluster, ready int32) {
	h.t.Helper()
	h.setMemberPodsReady(kvc, ready)
	var sts appsv1.StatefulSet
	h.get(&sts, kvc.Namespace, kvc.Name)
	sts.Status.Replicas = kvc.Spec.Partitions
	sts.Status.ObservedGeneration = sts.Generation
	sts.Status.UpdateRevision = testRevision(&sts)
	sts.Status.ReadyReplicas = ready
	sts.Status.AvailableReplicas = ready
	if err := h.client.Status().Update(context.Background(), &sts, client.FieldOwner("test-statefulset-controller")); err != nil {
		h.t.Fatalf("update StatefulSet status: %v", err)
	}
}

// setMemberPodsReady plays the kubelet alone: the cluster's member pods exist, labelled with the
// StatefulSet's current revision, running etcd, the first ready of them Ready.
func (h *harness) setMemberPodsReady(kvc *kvv1.KVCluster, ready int32) {
	h.t.Helper()
	var sts appsv1.StatefulSet
	h.get(&sts, kvc.Namespace, kvc.Name)
	for ord := range int(kvc.Spec.Partitions) {
		h.putMemberPod(kvc, &sts, ord, int32(ord) < ready)
	}
}

// putMemberPod creates member pod ord of the StatefulSet's current revision if it does not
// exist, and sets whether it is Ready (else its etcd runs but fails the readiness check). It
// returns the pod's UID.
func (h *harness) putMemberPod(kvc *kvv1.KVCluster, sts *appsv1.StatefulSet, ord int, ready bool) types.UID {
	h.t.Helper()
	ctx := context.Background()
	labels := specs.Labels(kvc)
	labels[appsv1.StatefulSetRevisionLabel] = testRevision(sts)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: kvc.Namespace, Name: specs.MemberName(kvc, ord), Labels: labels,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(sts, appsv1.SchemeGroupVersion.WithKind("StatefulSet"))}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "etcd"}}}}
	if err := h.client.Create(ctx, pod); apierrors.IsAlreadyExists(err) {
		h.get(pod, pod.Namespace, pod.Name)
		if pod.DeletionTimestamp != nil || !metav1.IsControlledBy(pod, sts) {
			h.t.Fatalf("pod %s exists, but is being deleted or is not the StatefulSet's", pod.Name)
		}
	} else if err != nil {
		h.t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	condition := corev1.ConditionFalse
	if ready {
		condition = corev1.ConditionTrue
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: condition}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "etcd", Ready: ready,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if err := h.client.Status().Update(ctx, pod); err != nil {
		h.t.Fatalf("set the status of pod %s: %v", pod.Name, err)
	}
	return pod.UID
}

// testRevision names a StatefulSet revision after its pod template, as the StatefulSet controller does.
func testRevision(sts *appsv1.StatefulSet) string {
	data, err := json.Marshal(sts.Spec.Template)
	if err != nil {
		panic(err)
	}
	h := fnv.New32a()
	h.Write(data)
	return fmt.Sprintf("%s-%x", sts.Name, h.Sum32())
}

func kstatusOf(t *testing.T, kvc *kvv1.KVCluster) status.Status {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(kvc)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(kvv1.GroupVersion.String())
	u.SetKind("KVCluster")
	res, err := status.Compute(u)
	if err != nil {
		t.Fatal(err)
	}
	return res.Status
}

// assertIdle reconciles once more and fails if that sent any write request to the API server.
func (h *harness) assertIdle(kvc *kvv1.KVCluster, when string) {
	h.t.Helper()
	before := writes.count()
	h.reconcile(kvc)
	if n := writes.count() - before; n != 0 {
		h.t.Errorf("%s: an idle reconcile sent %d write requests, want 0: %v", when, n, writes.last(n))
	}
}

func TestKVClusterGoesFromCreatingToReady(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("lifecycle")
	kvc := newKVCluster(ns, "kv", 3)
	h.create(kvc)
	h.members.set(members.Cluster{}, errNoQuorum)

	res := h.reconcile(kvc)
	if res.RequeueAfter == 0 {
		t.Error("a creating cluster must be looked at again (etcd health is polled)")
	}
	got := h.fresh(kvc)
	if got.Status.Phase != kvv1.PhaseCreating || !meta.IsStatusConditionTrue(got.Status.Conditions, kvv1.ConditionReconciling) {
		t.Fatalf("status after first reconcile = %+v, want Creating with Reconciling=True", got.Status)
	}
	if s := kstatusOf(t, got); s != status.InProgressStatus {
		t.Errorf("kstatus while creating = %s, want InProgress", s)
	}
	if got.Status.ClientEndpoint != "http://kv-client."+ns+".svc:2379" {
		t.Errorf("clientEndpoint = %q", got.Status.ClientEndpoint)
	}

	// Every owned object exists, is controlled by the KVCluster, and only our manager owns fields.
	owned := map[string]client.Object{
		"StatefulSet kv":  &appsv1.StatefulSet{},
		"Service kv-peer": &corev1.Service{}, "Service kv-client": &corev1.Service{},
		"PodDisruptionBudget kv": &policyv1.PodDisruptionBudget{},
	}
	for key, obj := range owned {
		h.get(obj, ns, strings.Fields(key)[1])
		if ref := metav1.GetControllerOf(obj); ref == nil || ref.UID != got.UID {
			t.Errorf("%s is not controlled by the KVCluster: %v", key, obj.GetOwnerReferences())
		}
		for _, mf := range obj.GetManagedFields() {
			if mf.Manager != specs.FieldManager || mf.Operation != metav1.ManagedFieldsOperationApply {
				t.Errorf("%s has fields managed by %q (%s), want only %q applying", key, mf.Manager, mf.Operation, specs.FieldManager)
			}
		}
	}
	for _, mf := range got.GetManagedFields() {
		if mf.Subresource == "status" && mf.Manager != specs.FieldManager {
			t.Errorf("KVCluster status has fields managed by %q", mf.Manager)
		}
	}
	if len(got.Finalizers) != 0 || got.Spec.Storage.Size.String() != "1Gi" {
		t.Errorf("the operator must never write the spec; spec = %+v", got.Spec)
	}

	h.assertIdle(kvc, "creating")

	h.setMembersReady(kvc, 3)
	h.members.set(memberstest.Healthy(kvc, 3, "3.7.3"), nil)
	res = h.reconcile(kvc)
	got = h.fresh(kvc)
	if got.Status.Phase != kvv1.PhaseReady || got.Status.ReadyPartitions != 3 || got.Status.CurrentVersion != "3.7.3" {
		t.Fatalf("status = %+v, want Ready 3/3 on 3.7.3", got.Status)
	}
	// Its members' connections are let go until its next look, a minute away.
	h.members.mu.Lock()
	notNeeded, notNeededFor := h.members.notNeeded, h.members.notNeededFor
	h.members.mu.Unlock()
	if want := (plan.Observation{}).ClientURLs(got); !slices.Equal(notNeeded, want) || notNeededFor != res.RequeueAfter || res.RequeueAfter < time.Minute {
		t.Errorf("members not needed: %v for %v (next look in %v), want %v for a minute or more", notNeeded, notNeededFor, res.RequeueAfter, want)
	}
	if !meta.IsStatusConditionTrue(got.Status.Conditions, kvv1.ConditionReady) {
		t.Errorf("Ready condition = %+v", meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionReady))
	}
	if s := kstatusOf(t, got); s != status.CurrentStatus {
		t.Errorf("kstatus when ready = %s, want Current", s)
	}
	if len(got.Status.Members) != 3 || !got.Status.Members[0].Leader {
		t.Errorf("members = %+v", got.Status.Members)
	}
	if ev := drainEvents(h); !strings.Contains(ev, "ClusterReady") {
		t.Errorf("events = %q, want a ClusterReady event", ev)
	}

	h.assertIdle(kvc, "ready")

	// Losing a member keeps the phase but says so on the Ready condition.
	h.setMembersReady(kvc, 2)
	down := memberstest.Healthy(kvc, 3, "3.7.3")
	down.Members[2].Healthy = false
	h.members.set(down, nil)
	h.reconcile(kvc)
	got = h.fresh(kvc)
	ready := meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionReady)
	if got.Status.Phase != kvv1.PhaseReady || ready.Status != metav1.ConditionFalse || ready.Reason != plan.ReasonMembersUnavailable {
		t.Errorf("with a member down: phase %s, Ready %+v", got.Status.Phase, ready)
	}
	h.setMembersReady(kvc, 3)
	h.members.set(memberstest.Healthy(kvc, 3, "3.7.3"), nil)
	h.reconcile(kvc)
	if got = h.fresh(kvc); !meta.IsStatusConditionTrue(got.Status.Conditions, kvv1.ConditionReady) {
		t.Errorf("after the member came back Ready = %+v", meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionReady))
	}
}

func drainEvents(h *harness) string {
	var out []string
	for {
		select {
		case e := <-h.recorder.Events:
			out = append(out, e)
		default:
			return strings.Join(out, "\n")
		}
	}
}

func TestEditedChildrenArePutBack(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("drift")
	kvc := newKVCluster(ns, "kv", 3)
	h.create(kvc)
	h.members.set(members.Cluster{}, errNoQuorum)
	h.reconcile(kvc)
	h.reconcile(kvc)

	ctx := context.Background()
	var sts appsv1.StatefulSet
	if err := h.r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kv"}, &sts); err != nil {
		t.Fatal(err)
	}
	if sts.Annotations[intentAnnotation] == "" || sts.ManagedFields != nil {
		t.Fatalf("the operator reads the StatefulSet with its managed fields, not the digest of its intent: %v", sts.ObjectMeta)
	}
	h.get(&sts, ns, "kv")
	five := int32(5)
	sts.Spec.Replicas = &five
	sts.Spec.Template.Spec.Containers[0].Image = "example.com/evil:latest"
	sts.Annotations = map[string]string{"team.example/owner": "storage"}
	if err := h.client.Update(ctx, &sts, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}
	var svc corev1.Service
	h.get(&svc, ns, "kv-client")
	if err := h.client.Delete(ctx, &svc); err != nil {
		t.Fatal(err)
	}

	h.reconcile(kvc)
	h.get(&sts, ns, "kv")
	if *sts.Spec.Replicas != 3 || sts.Spec.Template.Spec.Containers[0].Image != "gcr.io/etcd-development/etcd:v3.7.3" {
		t.Errorf("drift not corrected: replicas %d image %s", *sts.Spec.Replicas, sts.Spec.Template.Spec.Containers[0].Image)
	}
	if sts.Annotations["team.example/owner"] != "storage" {
		t.Errorf("a field the operator does not own was removed: annotations %v", sts.Annotations)
	}
	h.get(&svc, ns, "kv-client") // re-created
	h.assertIdle(kvc, "after correcting drift")
}

func TestStalledCreationFailsAndASpecChangeRetries(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("stalled")
	kvc := newKVCluster(ns, "kv", 3)
	h.create(kvc)
	h.members.set(members.Cluster{}, errNoQuorum)
	h.reconcile(kvc)
	h.setMembersReady(kvc, 1)
	h.reconcile(kvc)

	h.clock.SetTime(h.clock.Now().Add(11 * time.Minute))
	h.reconcile(kvc)
	got := h.fresh(kvc)
	stalled := meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionStalled)
	if got.Status.Phase != kvv1.PhaseFailed || stalled == nil || stalled.Status != metav1.ConditionTrue || stalled.Reason != plan.ReasonProgressDeadline {
		t.Fatalf("after the deadline: phase %s, Stalled %+v", got.Status.Phase, stalled)
	}
	if !strings.Contains(stalled.Message, "1/3 members ready") || !strings.Contains(stalled.Message, "kubectl describe pods") {
		t.Errorf("the message must say what is wrong and what to do: %q", stalled.Message)
	}
	if s := kstatusOf(t, got); s != status.FailedStatus {
		t.Errorf("kstatus when failed = %s, want Failed", s)
	}
	if ev := drainEvents(h); !strings.Contains(ev, "Warning "+plan.ReasonProgressDeadline) {
		t.Errorf("events = %q, want a Warning %s event", ev, plan.ReasonProgressDeadline)
	}
	h.assertIdle(kvc, "failed")

	got.Spec.ProgressDeadlineSeconds = 1200
	if err := h.client.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	h.reconcile(kvc)
	got = h.fresh(kvc)
	if got.Status.Phase != kvv1.PhaseCreating || meta.IsStatusConditionTrue(got.Status.Conditions, kvv1.ConditionStalled) {
		t.Errorf("after a spec change: phase %s, conditions %+v", got.Status.Phase, got.Status.Conditions)
	}
	if s := kstatusOf(t, got); s != status.InProgressStatus {
		t.Errorf("kstatus after a spec change = %s, want InProgress", s)
	}
}

func TestAdmissionRejectsInvalidManifests(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("admission")
	ctx := context.Background()
	valid := func(name string) *kvv1.KVCluster { return withBackups(newKVCluster(ns, name, 3), "0 3 * * *") }

	createCases := []struct {
		name    string
		mutate  func(*kvv1.KVCluster)
		wantErr string // "" = accepted
	}{
		{"missing version", func(k *kvv1.KVCluster) { k.Spec.Version = "" }, "spec.version"},
		{"version with a v", func(k *kvv1.KVCluster) { k.Spec.Version = "v3.7.3" }, "without a leading 'v'"},
		{"version not semver", func(k *kvv1.KVCluster) { k.Spec.Version = "latest" }, "MAJOR.MINOR.PATCH"},
		{"version with two parts", func(k *kvv1.KVCluster) { k.Spec.Version = "3.7" }, "MAJOR.MINOR.PATCH"},
		{"etcd 3.5 unsupported", func(k *kvv1.KVCluster) { k.Spec.Version = "3.5.17" }, "from 3.6.0 on are supported"},
		{"etcd 4 unsupported", func(k *kvv1.KVCluster) { k.Spec.Version = "4.0.0" }, "from 3.6.0 on are supported"},
		{"zero partitions", func(k *kvv1.KVCluster) { k.Spec.Partitions = 0 }, "spec.partitions"},
		{"negative partitions", func(k *kvv1.KVCluster) { k.Spec.Partitions = -1 }, "greater than or equal to 1"},
		{"too many partitions", func(k *kvv1.KVCluster) { k.Spec.Partitions = 10 }, "less than or equal to 9"},
		{"6-field cron", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "0 0 3 * * *" }, "exactly 5 fields"},
		{"cron word", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "daily" }, "exactly 5 fields"},
		{"@every has no slots", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "@every 5m" }, "@every are not accepted"},
		{"a zone and 4 fields", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "CRON_TZ=Europe/Berlin 0 3 * *" }, "exactly 5 fields"},
		{"6 fields apart by tabs", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "0\t0\t3 * * *" }, "exactly 5 fields"},
		{"a zone and 5 fields", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "CRON_TZ=Europe/Berlin 0 3 * * *" }, ""},
		{"a zone and a descriptor", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "CRON_TZ=UTC @daily" }, ""},
		{"a descriptor", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "@hourly" }, ""},
		{"tiny volume", func(k *kvv1.KVCluster) { k.Spec.Storage.Size = resource.MustParse("10Mi") }, "at least 512Mi"},
		{"a volume too small for the WAL and a database", func(k *kvv1.KVCluster) { k.Spec.Storage.Size = resource.MustParse("384Mi") }, "at least 512Mi"},
		{"unknown network policy mode", func(k *kvv1.KVCluster) { k.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{Mode: "Off"} }, "spec.networkPolicy.mode"},
		{"clients named with the network policy disabled", func(k *kvv1.KVCluster) {
			k.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{Mode: kvv1.NetworkPolicyDisabled,
				ClientsFrom: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}
		}, "clientsFrom and metricsFrom need mode Managed"},
		{"a peer that names no one", func(k *kvv1.KVCluster) {
			k.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{ClientsFrom: []networkingv1.NetworkPolicyPeer{{}}}
		}, "each peer needs a podSelector, a namespaceSelector or an ipBlock"},
		{"an address block with a selector", func(k *kvv1.KVCluster) {
			k.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{MetricsFrom: []networkingv1.NetworkPolicyPeer{{
				IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}, PodSelector: &metav1.LabelSelector{}}}}
		}, "a peer with an ipBlock can have no selector"},
		{"an address block that is no CIDR", func(k *kvv1.KVCluster) {
			k.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{ClientsFrom: []networkingv1.NetworkPolicyPeer{{
				IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0"}}}}
		}, "ipBlock.cidr must be a CIDR"},
		{"an address block", func(k *kvv1.KVCluster) {
			k.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{ClientsFrom: []networkingv1.NetworkPolicyPeer{{
				IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}}}}
		}, ""},
		{"clients and scrapers named", func(k *kvv1.KVCluster) {
			k.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{
				ClientsFrom: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "shop"}}}},
				MetricsFrom: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}}}
		}, ""},
		{"bad storage class", func(k *kvv1.KVCluster) { k.Spec.Storage.StorageClassName = "Fast_SSD" }, "storageClassName"},
		{"bad repository", func(k *kvv1.KVCluster) { k.Spec.Repository = "My Registry/etcd" }, "spec.repository"},
		{"deadline too short", func(k *kvv1.KVCluster) { k.Spec.ProgressDeadlineSeconds = 5 }, "greater than or equal to 30"},
		{"name too long", func(k *kvv1.KVCluster) { k.Name = strings.Repeat("a", 53) }, "at most 52 characters"},
		{"name with a dot", func(k *kvv1.KVCluster) { k.Name = "kv.prod" }, "must be a DNS label"},
		{"name starting with a digit", func(k *kvv1.KVCluster) { k.Name = "1kv" }, "must be a DNS label"},
		{"two backup destinations", func(k *kvv1.KVCluster) { k.Spec.Backup.PVC = &kvv1.PVCDestination{ClaimName: "v"} }, "exactly one destination: s3 or pvc"},
		{"no backup destination", func(k *kvv1.KVCluster) { k.Spec.Backup.S3 = nil }, "exactly one destination: s3 or pvc"},
		{"PVC prefix escaping", func(k *kvv1.KVCluster) {
			k.Spec.Backup = &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "v", Prefix: "a/../.."}}
		}, "nor contain '..'"},
		{"restore from two sources", func(k *kvv1.KVCluster) {
			k.Spec.Restore = &kvv1.RestoreSpec{S3: k.Spec.Backup.S3, PVC: &kvv1.PVCDestination{ClaimName: "v"}, Key: "x.db"}
		}, "exactly one source: s3 or pvc"},
		{"ok: PVC destination", func(k *kvv1.KVCluster) {
			k.Spec.Backup = &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "backup-volume"}}
		}, ""},
		{"schedule without a destination", func(k *kvv1.KVCluster) { k.Spec.Backup = nil }, "backupSchedule needs spec.backup (s3 or pvc)"},
		{"S3 endpoint with a scheme", func(k *kvv1.KVCluster) { k.Spec.Backup.S3.Endpoint = "https://s3.example.com" }, "without a scheme"},
		{"S3 bucket with capitals", func(k *kvv1.KVCluster) { k.Spec.Backup.S3.Bucket = "My_Bucket" }, "spec.backup.s3.bucket"},
		{"S3 prefix with a slash", func(k *kvv1.KVCluster) { k.Spec.Backup.S3.Prefix = "/backups/" }, "must not start or end with '/'"},
		{"S3 without credentials", func(k *kvv1.KVCluster) { k.Spec.Backup.S3.CredentialsSecret = "" }, "credentialsSecret"},
		{"unknown final backup policy", func(k *kvv1.KVCluster) { k.Spec.Backup.FinalBackup = "Maybe" }, "Unsupported value"},
		{"starting deadline too short", func(k *kvv1.KVCluster) { k.Spec.Backup.StartingDeadlineSeconds = 5 }, "greater than or equal to 60"},
		{"ok: no backups at all", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule, k.Spec.Backup = "", nil }, ""},
		{"ok: final backup only", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "" }, ""},
		{"restore with a bad checksum", func(k *kvv1.KVCluster) {
			k.Spec.Restore = &kvv1.RestoreSpec{S3: k.Spec.Backup.S3, Key: "team/x.db", SHA256: "abc"}
		}, "spec.restore.sha256"},
		{"restore without a key", func(k *kvv1.KVCluster) { k.Spec.Restore = &kvv1.RestoreSpec{S3: k.Spec.Backup.S3} }, "spec.restore.key"},
		{"ok: restore", func(k *kvv1.KVCluster) {
			k.Spec.Restore = &kvv1.RestoreSpec{S3: k.Spec.Backup.S3, Key: "team/x.db", SHA256: strings.Repeat("a", 64)}
		}, ""},
		{"ok: 3.6 patch", func(k *kvv1.KVCluster) { k.Spec.Version = "3.6.16" }, ""},
		{"ok: descriptor", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "@daily" }, ""},
		{"ok: step cron", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "*/5 * * * *" }, ""},
		{"ok: cron with time zone", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "CRON_TZ=Europe/Berlin 0 3 * * 1-5" }, ""},
		{"ok: one member", func(k *kvv1.KVCluster) { k.Spec.Partitions = 1 }, ""},
	}
	for i, tc := range createCases {
		t.Run("create/"+tc.name, func(t *testing.T) {
			k := valid(fmt.Sprintf("c%d", i))
			tc.mutate(k)
			err := h.client.Create(ctx, k)
			checkAdmission(t, err, tc.wantErr)
		})
	}

	base := valid("update-base")
	base.Spec.Storage.Size = resource.MustParse("1Gi")
	if err := h.client.Create(ctx, base); err != nil {
		t.Fatal(err)
	}
	updateCases := []struct {
		name    string
		mutate  func(*kvv1.KVCluster)
		wantErr string
	}{
		{"ok: partitions change (scaling)", func(k *kvv1.KVCluster) { k.Spec.Partitions = 5 }, ""},
		{"partitions beyond the maximum", func(k *kvv1.KVCluster) { k.Spec.Partitions = 10 }, "less than or equal to 9"},
		{"storage shrinks", func(k *kvv1.KVCluster) { k.Spec.Storage.Size = resource.MustParse("512Mi") }, "spec.storage.size cannot shrink from 1Gi to 512Mi"},
		{"storage class change", func(k *kvv1.KVCluster) { k.Spec.Storage.StorageClassName = "other" }, "storageClassName cannot be changed after creation"},
		{"ok: storage grows", func(k *kvv1.KVCluster) { k.Spec.Storage.Size = resource.MustParse("2Gi") }, ""},
		{"the grown storage cannot shrink back", func(k *kvv1.KVCluster) { k.Spec.Storage.Size = resource.MustParse("1Gi") }, "storage.size cannot shrink"},
		{"ok: the same size written another way", func(k *kvv1.KVCluster) { k.Spec.Storage.Size = resource.MustParse("2048Mi") }, ""},
		{"ok: schedule change", func(k *kvv1.KVCluster) { k.Spec.BackupSchedule = "0 * * * *" }, ""},
		{"restore added later", func(k *kvv1.KVCluster) {
			k.Spec.Restore = &kvv1.RestoreSpec{S3: k.Spec.Backup.S3, Key: "team/x.db"}
		}, "restore is set at creation and cannot be changed"},
	}
	for _, tc := range updateCases {
		t.Run("update/"+tc.name, func(t *testing.T) {
			k := &kvv1.KVCluster{}
			h.get(k, ns, base.Name)
			tc.mutate(k)
			checkAdmission(t, h.client.Update(ctx, k), tc.wantErr)
		})
	}
}

func checkAdmission(t *testing.T, err error, wantErr string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Errorf("rejected a valid manifest: %v", err)
	case wantErr != "" && err == nil:
		t.Errorf("accepted an invalid manifest, want an error containing %q", wantErr)
	case wantErr != "" && !apierrors.IsInvalid(err):
		t.Errorf("error %v is not an Invalid error", err)
	case wantErr != "" && !strings.Contains(err.Error(), wantErr):
		t.Errorf("error %q does not contain %q", err.Error(), wantErr)
	}
}

// TestAdmissionOfVersionChanges: upgrades go forward one minor version at a time (3.6 to 3.7 only
// from 3.6.11 on); downgrades are refused, except back to status.currentVersion while an upgrade
// has not finished.
func TestAdmissionOfVersionChanges(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("versions")
	ctx := context.Background()
	cases := []struct {
		name, from, current, to string
		wantErr                 string
	}{
		{"patch upgrade", "3.7.3", "3.7.3", "3.7.4", ""},
		{"patch upgrade skipping patches", "3.6.11", "3.6.11", "3.6.16", ""},
		{"minor upgrade from the required 3.6 patch", "3.6.16", "3.6.16", "3.7.3", ""},
		{"minor upgrade from exactly 3.6.11", "3.6.11", "3.6.11", "3.7.0", ""},
		{"minor upgrade from an old 3.6 patch", "3.6.10", "3.6.10", "3.7.3", "requires 3.6.11 or later before 3.7"},
		{"minor upgrade from 3.6.0", "3.6.0", "3.6.0", "3.7.3", "requires 3.6.11 or later before 3.7"},
		{"next minor, later patch", "3.7.3", "3.7.3", "3.8.1", ""},
		{"skipping a minor version", "3.6.16", "3.6.16", "3.8.0", "cannot skip a minor version (3.6.16 to 3.8.0)"},
		{"patch downgrade", "3.7.4", "3.7.4", "3.7.3", "cannot go down from 3.7.4 to 3.7.3"},
		{"minor downgrade", "3.7.3", "3.7.3", "3.6.16", "cannot go down from 3.7.3 to 3.6.16"},
		{"major change", "3.7.3", "3.7.3", "4.0.0", "from 3.6.0 on are supported"},
		{"going back during an unfinished upgrade", "3.7.3", "3.6.16", "3.6.16", ""},
		{"going below the running version during an upgrade", "3.7.3", "3.6.16", "3.6.15", "cannot go down from 3.7.3 to 3.6.15"},
		{"unchanged", "3.6.16", "3.6.16", "3.6.16", ""},
		{"not a version", "3.7.3", "3.7.3", "3.7", "MAJOR.MINOR.PATCH"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := newKVCluster(ns, fmt.Sprintf("v%d", i), 3)
			k.Spec.Version = tc.from
			if err := h.client.Create(ctx, k); err != nil {
				t.Fatalf("create at %s: %v", tc.from, err)
			}
			k.Status.CurrentVersion = tc.current
			if err := h.client.Status().Update(ctx, k); err != nil {
				t.Fatalf("set status.currentVersion: %v", err)
			}
			k.Spec.Version = tc.to
			checkAdmission(t, h.client.Update(ctx, k), tc.wantErr)
		})
	}
}

// TestPermissionsSufficeWhereOwnerReferencesAreEnforced: a cluster with OwnerReferencesPermissionEnforcement
// (OpenShift, hardened clusters) refuses children with blockOwnerDeletion unless the writer may
// update the owner's finalizers. The reconciler runs with only the shipped ClusterRole.
func TestPermissionsSufficeWhereOwnerReferencesAreEnforced(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("ownerrefs")
	kvc := withBackups(newKVCluster(ns, "kv", 3), "")
	h.create(kvc)
	h.members.set(members.Cluster{}, errNoQuorum)
	if _, err := h.r.Reconcile(context.Background(), requestFor(kvc)); err != nil {
		t.Fatalf("reconcile as the operator's ServiceAccount: %v", err)
	}
	var sts appsv1.StatefulSet
	h.get(&sts, ns, "kv")
	if ref := metav1.GetControllerOf(&sts); ref == nil || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		t.Errorf("StatefulSet owner reference = %+v, want the KVCluster blocking its deletion", ref)
	}
}

// TestAdmissionRejectsUnworkableSpecs: manifests the API server used to admit although nothing
// could run them, or that point outside the backup destination.
// withQuota sets spec.space.backendQuota, and storage.size unless empty.
func withQuota(quota, size string) func(*kvv1.KVCluster) {
	return func(k *kvv1.KVCluster) {
		q := resource.MustParse(quota)
		k.Spec.Space.BackendQuota = &q
		if size != "" {
			k.Spec.Storage.Size = resource.MustParse(size)
		}
	}
}

func withCompaction(mode kvv1.AutoCompactionMode, retention string) func(*kvv1.KVCluster) {
	return func(k *kvv1.KVCluster) {
		k.Spec.Space.AutoCompaction = kvv1.AutoCompactionSpec{Mode: mode, Retention: retention}
	}
}

// withPods sets spec.pods.
func withPods(p kvv1.PodPolicy) func(*kvv1.KVCluster) {
	return func(k *kvv1.KVCluster) { k.Spec.Pods = p }
}

// withDefragmentation sets spec.space.defragmentation.
func withDefragmentation(mode kvv1.DefragmentationMode, schedule string) func(*kvv1.KVCluster) {
	return func(k *kvv1.KVCluster) {
		k.Spec.Space.Defragmentation = kvv1.DefragmentationSpec{Mode: mode, Schedule: schedule}
	}
}

func TestAdmissionRejectsUnworkableSpecs(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("unworkable")
	ctx := context.Background()
	resources := func(req, lim corev1.ResourceList) func(*kvv1.KVCluster) {
		return func(k *kvv1.KVCluster) { k.Spec.Resources = corev1.ResourceRequirements{Requests: req, Limits: lim} }
	}
	q := resource.MustParse
	s3 := func() *kvv1.S3Destination {
		return &kvv1.S3Destination{Endpoint: "s3.backup.svc:7070", Bucket: "backups", CredentialsSecret: "s3-credentials"}
	}
	tests := []struct {
		name    string
		mutate  func(*kvv1.KVCluster)
		wantErr string // "" = accepted
	}{
		{name: "memory request above its limit", mutate: resources(corev1.ResourceList{"memory": q("2Gi")}, corev1.ResourceList{"memory": q("1Gi")}),
			wantErr: "resources.requests must not exceed resources.limits"},
		{name: "cpu request above its limit", mutate: resources(corev1.ResourceList{"cpu": q("2")}, corev1.ResourceList{"cpu": q("500m")}),
			wantErr: "resources.requests must not exceed resources.limits"},
		{name: "ok: requests equal to limits", mutate: resources(corev1.ResourceList{"cpu": q("500m"), "memory": q("1Gi")}, corev1.ResourceList{"cpu": q("0.5"), "memory": q("1024Mi")})},
		{name: "ok: only a memory limit", mutate: resources(corev1.ResourceList{"cpu": q("1")}, corev1.ResourceList{"memory": q("1Gi")})},
		{name: "credentials Secret that is not a name", mutate: func(k *kvv1.KVCluster) { k.Spec.Backup.S3.CredentialsSecret = "S3 Credentials" },
			wantErr: "spec.backup.s3.credentialsSecret"},
		{name: "S3 without credentials", mutate: func(k *kvv1.KVCluster) { k.Spec.Backup.S3.CredentialsSecret = "" },
			wantErr: "s3 needs exactly one source of credentials: credentialsSecret, or workloadIdentity: true"},
		{name: "S3 with both a Secret and the workload's identity", mutate: func(k *kvv1.KVCluster) { k.Spec.Backup.S3.WorkloadIdentity = true },
			wantErr: "s3 needs exactly one source of credentials"},
		{name: "restore from S3 without credentials", mutate: func(k *kvv1.KVCluster) {
			k.Spec.Restore = &kvv1.RestoreSpec{S3: &kvv1.S3Destination{Endpoint: "s3.backup.svc:7070", Bucket: "backups"}, Key: "ns/kv/kv-final.db"}
		}, wantErr: "spec.restore.s3: Invalid value"},
		{name: "ok: S3 with the workload's identity and a ServiceAccount", mutate: func(k *kvv1.KVCluster) {
			k.Spec.Backup.S3 = &kvv1.S3Destination{Endpoint: "s3.eu-central-1.amazonaws.com", Bucket: "backups", Region: "eu-central-1", WorkloadIdentity: true}
			k.Spec.Pods.ServiceAccountName = "etcd-backups"
		}},
		{name: "a ServiceAccount that is not a name", mutate: withPods(kvv1.PodPolicy{ServiceAccountName: "Backups Role"}),
			wantErr: "spec.pods.serviceAccountName"},
		{name: "claim that is not a name", mutate: func(k *kvv1.KVCluster) {
			k.Spec.Backup = &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "../backups"}}
		},
			wantErr: "spec.backup.pvc.claimName"},
		{name: "restore claim that is not a name", mutate: func(k *kvv1.KVCluster) {
			k.Spec.Restore = &kvv1.RestoreSpec{PVC: &kvv1.PVCDestination{ClaimName: "Backups"}, Key: "ns/kv/kv-final.db"}
		}, wantErr: "spec.restore.pvc.claimName"},
		{name: "URL Secret that is not a name", mutate: func(k *kvv1.KVCluster) {
			k.Spec.Deregistration = &kvv1.DeregistrationSpec{HTTP: &kvv1.HTTPDeregistration{URLSecret: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "Registry Token"}, Key: "url"}}}
		}, wantErr: "urlSecret.name must be the name of a Secret"},
		{name: "repository with a tag", mutate: func(k *kvv1.KVCluster) { k.Spec.Repository = "registry.example.com/etcd:v3.7.3" },
			wantErr: "repository must not carry a tag"},
		{name: "repository with a digest", mutate: func(k *kvv1.KVCluster) { k.Spec.Repository = "registry.example.com/etcd@sha256:abc" },
			wantErr: "spec.repository"},
		{name: "ok: repository on a registry port", mutate: func(k *kvv1.KVCluster) { k.Spec.Repository = "registry.example.com:5000/etcd" }},
		{name: "quota under 16Mi", mutate: withQuota("8Mi", ""), wantErr: "space.backendQuota must be from 16Mi to 8Gi"},
		{name: "quota over 8Gi", mutate: withQuota("9Gi", "100Gi"), wantErr: "space.backendQuota must be from 16Mi to 8Gi"},
		{name: "quota over what the volume holds beside the WAL", mutate: withQuota("700Mi", "1Gi"), wantErr: "at most 85% of storage.size less 256MB"},
		{name: "quota over what the default volume holds", mutate: withQuota("700Mi", ""), wantErr: "at most 85% of storage.size less 256MB"},
		{name: "ok: the largest quota the volume holds", mutate: withQuota("620Mi", "1Gi")},
		{name: "periodic retention that is no duration", mutate: withCompaction(kvv1.AutoCompactionPeriodic, "1000"), wantErr: "a duration from 1m to 8760h"},
		{name: "revision retention that is no number", mutate: withCompaction(kvv1.AutoCompactionRevision, "1h"), wantErr: "a number of revisions"},
		{name: "unknown compaction mode", mutate: withCompaction("Hourly", ""), wantErr: "spec.space.autoCompaction.mode"},
		{name: "periodic retention of zero: no compaction at all", mutate: withCompaction(kvv1.AutoCompactionPeriodic, "0s"), wantErr: "a duration from 1m to 8760h"},
		{name: "periodic retention past a year", mutate: withCompaction(kvv1.AutoCompactionPeriodic, "3000000h"), wantErr: "a duration from 1m to 8760h"},
		{name: "ok: periodic, 90 minutes", mutate: withCompaction(kvv1.AutoCompactionPeriodic, "1h30m")},
		{name: "ok: by revision, default retention", mutate: withCompaction(kvv1.AutoCompactionRevision, "")},
		{name: "defragmentation schedule with seconds", mutate: withDefragmentation(kvv1.DefragmentationAuto, "0 0 3 * * *"), wantErr: "defragmentation.schedule must have exactly 5 fields"},
		{name: "defragmentation schedule @every", mutate: withDefragmentation(kvv1.DefragmentationAuto, "@every 1h"), wantErr: "defragmentation.schedule must have exactly 5 fields"},
		{name: "unknown defragmentation mode", mutate: withDefragmentation("Nightly", ""), wantErr: "spec.space.defragmentation.mode"},
		{name: "ok: defragmentation off", mutate: withDefragmentation(kvv1.DefragmentationOff, "")},
		{name: "ok: defragmentation in a zone's night", mutate: withDefragmentation(kvv1.DefragmentationAuto, "CRON_TZ=Europe/Berlin 0 3 * * *")},
		{name: "a pod label the operator sets", mutate: withPods(kvv1.PodPolicy{Labels: map[string]string{"app.kubernetes.io/instance": "other"}}),
			wantErr: "pods.labels may not set app.kubernetes.io/*"},
		{name: "a pod label of the StatefulSet controller", mutate: withPods(kvv1.PodPolicy{Labels: map[string]string{"controller-revision-hash": "x"}}),
			wantErr: "pods.labels may not set"},
		{name: "a pod annotation of the operator's", mutate: withPods(kvv1.PodPolicy{Annotations: map[string]string{kvv1.AnnotationBackupNow: "x"}}),
			wantErr: "pods.annotations may not set kvcluster.io/*"},
		{name: "a spread constraint with its own selector", mutate: withPods(kvv1.PodPolicy{TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}}}}),
			wantErr: "pods.topologySpreadConstraints take no labelSelector"},
		{name: "a toleration with an unknown effect", mutate: withPods(kvv1.PodPolicy{Tolerations: []corev1.Toleration{{Key: "storage", Effect: "Sometimes"}}}),
			wantErr: "pods.tolerations: effect must be NoSchedule, PreferNoSchedule or NoExecute"},
		{name: "a toleration without a key that is no Exists", mutate: withPods(kvv1.PodPolicy{Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpEqual, Value: "x"}}}),
			wantErr: "a toleration without a key needs operator Exists"},
		{name: "tolerationSeconds without NoExecute", mutate: withPods(kvv1.PodPolicy{Tolerations: []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists,
			Effect: corev1.TaintEffectNoSchedule, TolerationSeconds: ptr.To[int64](60)}}}),
			wantErr: "tolerationSeconds needs effect NoExecute"},
		{name: "two spread constraints on one key and policy", mutate: withPods(kvv1.PodPolicy{TopologySpreadConstraints: []corev1.TopologySpreadConstraint{
			{MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule},
			{MaxSkew: 2, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule}}}),
			wantErr: "spec.pods.topologySpreadConstraints[1]: Duplicate value"},
		{name: "ok: tolerate every taint", mutate: withPods(kvv1.PodPolicy{Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}})},
		{name: "ok: placed on storage nodes, spread hard across zones", mutate: withPods(kvv1.PodPolicy{
			NodeSelector:              map[string]string{"node-role": "storage"},
			Tolerations:               []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "storage", Effect: corev1.TaintEffectNoSchedule}},
			TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule}},
			PriorityClassName:         "system-cluster-critical", Labels: map[string]string{"team": "payments"}, Annotations: map[string]string{"note": "x"},
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "registry"}}})},
		{name: "S3 prefix climbing out", mutate: func(k *kvv1.KVCluster) { k.Spec.Backup.S3.Prefix = "team/../other-team" },
			wantErr: "prefix must not contain '.' or '..' path segments"},
		{name: "restore key climbing out", mutate: func(k *kvv1.KVCluster) {
			k.Spec.Restore = &kvv1.RestoreSpec{PVC: &kvv1.PVCDestination{ClaimName: "backups"}, Key: "../../etc/kv-final.db"}
		}, wantErr: "key must not contain '.' or '..' path segments"},
		{name: "ok: restore key with dots in names", mutate: func(k *kvv1.KVCluster) {
			k.Spec.Restore = &kvv1.RestoreSpec{S3: s3(), Key: "team.prod/kv/kv-final..2026.db"}
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := withBackups(newKVCluster(ns, fmt.Sprintf("u%d", i), 3), "")
			tc.mutate(k)
			checkAdmission(t, h.client.Create(ctx, k), tc.wantErr)
		})
	}
}

// denyStatefulSetChanges makes the API server refuse every change of the StatefulSets of ns, as a
// platform's admission policy may, and waits until it does. It returns a function lifting it.
func (h *harness) denyStatefulSetChanges(ns, sts string) func() {
	h.t.Helper()
	ctx := context.Background()
	name := "deny-sts-" + ns
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"statefulsets"}},
				}}},
			},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "StatefulSet changes are frozen by policy"}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}
	for _, obj := range []client.Object{policy, binding} {
		if err := h.client.Create(ctx, obj); err != nil {
			h.t.Fatal(err)
		}
	}
	probe := func() error {
		var s appsv1.StatefulSet
		h.get(&s, ns, sts)
		s.Annotations = map[string]string{"probe": time.Now().String()}
		return h.client.Update(ctx, &s)
	}
	for deadline := time.Now().Add(20 * time.Second); probe() == nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			h.t.Fatal("the admission policy did not take effect")
		}
	}
	return func() {
		if err := h.client.Delete(ctx, binding); err != nil {
			h.t.Fatal(err)
		}
		for deadline := time.Now().Add(20 * time.Second); probe() != nil; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				h.t.Fatal("the admission policy was not lifted")
			}
		}
	}
}

// TestARejectedApplyIsReportedAndBackupsGoOn: when the API server refuses the cluster's objects
// (an admission policy, a quota), status says why and scheduled backups still run; once the
// refusal is lifted, the cluster goes on.
func TestARejectedApplyIsReportedAndBackupsGoOn(t *testing.T) {
	h := newHarness(t)
	ns := h.namespace("rejected")
	kvc := h.readyCluster(withBackups(newKVCluster(ns, "kv", 3), "*/5 * * * *"))
	slot := kvc.Status.NextBackupTime.Time
	lift := h.denyStatefulSetChanges(ns, "kv")

	h.setSpec(kvc, func(k *kvv1.KVCluster) {
		k.Spec.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}}
	})
	h.clock.SetTime(slot.Add(10 * time.Second))
	h.reconcile(kvc) // fails the test if the reconcile returns an error
	got := h.fresh(kvc)
	stalled := meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionStalled)
	if got.Status.Phase != kvv1.PhaseFailed || stalled == nil || stalled.Reason != plan.ReasonApplyRejected || !strings.Contains(stalled.Message, "frozen by policy") {
		t.Errorf("phase %s, Stalled %+v; want Failed, ApplyRejected with the API server's words", got.Status.Phase, stalled)
	}
	if got.Status.ObservedGeneration != got.Generation {
		t.Errorf("status describes generation %d, want %d", got.Status.ObservedGeneration, got.Generation)
	}
	if jobs := h.backupJobs(kvc); len(jobs) != 1 || jobs[0].Name != backup.JobName("kv", slot) {
		t.Errorf("backup Jobs = %v, want the slot's backup although the StatefulSet cannot be changed", names(jobs))
	}
	if ev := drainEvents(h); strings.Count(ev, "Warning "+plan.ReasonApplyRejected) != 1 {
		t.Errorf("events = %q, want one Warning %s", ev, plan.ReasonApplyRejected)
	}

	lift()
	h.reconcile(kvc)
	if got := h.fresh(kvc); got.Status.Phase == kvv1.PhaseFailed {
		t.Errorf("still Failed after the refusal was lifted: %+v", meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionStalled))
	}
	var sts appsv1.StatefulSet
	h.get(&sts, ns, "kv")
	if r := sts.Spec.Template.Spec.Containers[0].Resources.Requests.Memory(); r.String() != "128Mi" {
		t.Errorf("the StatefulSet was not brought to the spec once allowed: requests %v", r)
	}
}
