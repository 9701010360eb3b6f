package controllers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/certs"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// TestCachedFormKeepsWhatTheOperatorReads: of a pod (a member's, a Job's) the cache keeps what
// observe reads (the same state, transport and termination message come out of it) and drops the
// rest of its spec and status, most of its size; of a Job, only the managed fields go.
func TestCachedFormKeepsWhatTheOperatorReads(t *testing.T) {
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(2381)}}, PeriodSeconds: 5}
	pod := func() *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "kv-1", Namespace: "ns", UID: "pod-uid", CreationTimestamp: metav1.Now(),
				Labels: map[string]string{appsv1.StatefulSetRevisionLabel: "kv-5d8f", specs.ClusterLabel: "kv", specs.ManagedByLabel: specs.ManagedByValue,
					appsv1.StatefulSetPodNameLabel: "kv-1", appsv1.PodIndexLabel: "1"},
				Annotations:   map[string]string{specs.TrustAnnotation: "0123abcd"},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate}}},
			Spec: corev1.PodSpec{
				InitContainers: []corev1.Container{{Name: "init", Image: "busybox", Command: []string{"sh", "-c", "true"}}},
				Containers: []corev1.Container{{Name: "etcd", Image: "registry.k8s.io/etcd:v3.7.3", Command: []string{"etcd"},
					Args: []string{"--listen-client-urls=https://0.0.0.0:2379", "--listen-peer-urls=https://0.0.0.0:2380",
						"--peer-cert-file=/etc/etcd/tls/peer/tls.crt", "--quota-backend-bytes=2147483648"},
					Env:            []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
					ReadinessProbe: probe, LivenessProbe: probe, StartupProbe: probe,
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/etcd"}, {Name: "tls-peer", MountPath: "/etc/etcd/tls/peer"}}}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-kv-1"}}},
					{Name: "tls-peer", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "kv-peer-tls"}}}},
				Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
				NodeName:    "node-1",
			},
			Status: corev1.PodStatus{
				Phase: corev1.PodRunning, PodIP: "10.0.0.7", HostIP: "192.168.0.2",
				Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
					{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.Now(), Reason: "ContainersNotReady", Message: "containers with unready status: [sidecar]"}},
				ContainerStatuses: []corev1.ContainerStatus{{Name: "etcd", RestartCount: 2, ImageID: "sha256:0123",
					State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "member has already been bootstrapped"}}},
					{Name: "sidecar", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s"}}}},
				InitContainerStatuses: []corev1.ContainerStatus{{Name: "init", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}}},
			},
		}
	}
	finished := pod() // a backup Job's
	finished.Labels = map[string]string{specs.ClusterLabel: "kv", batchv1.ControllerUidLabel: "job-uid", batchv1.JobNameLabel: "kv-backup"}
	finished.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: `{"backup":"done"}`}}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
	}{{"a running member", pod()}, {"a finished pod", finished}, {"a pod being deleted", func() *corev1.Pod {
		p := pod()
		p.DeletionTimestamp = &metav1.Time{Time: p.CreationTimestamp.Add(3)}
		return p
	}()}} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.pod.DeepCopy()
			after := cachedForm(tc.pod).(*corev1.Pod)
			if got, want := memberPodStateOf(after), memberPodStateOf(before); got != want {
				t.Errorf("member state = %+v, want %+v", got, want)
			}
			gotT, gotOK := specs.PodTransport(after.Spec)
			wantT, wantOK := specs.PodTransport(before.Spec)
			if gotT != wantT || gotOK != wantOK {
				t.Errorf("transport = %+v %v, want %+v %v", gotT, gotOK, wantT, wantOK)
			}
			if got, want := plan.TerminationMessage([]corev1.Pod{*after}), plan.TerminationMessage([]corev1.Pod{*before}); got != want {
				t.Errorf("termination message = %q, want %q", got, want)
			}
			if isMemberPod(after) != isMemberPod(before) || after.UID != before.UID || !after.CreationTimestamp.Equal(&before.CreationTimestamp) ||
				!after.DeletionTimestamp.Equal(before.DeletionTimestamp) || indexByCluster(after)[0] != "kv" ||
				after.Labels[batchv1.ControllerUidLabel] != before.Labels[batchv1.ControllerUidLabel] { // jobReportFrom's selector
				t.Errorf("metadata changed: %+v, want %+v", after.ObjectMeta, before.ObjectMeta)
			}
			if after.ManagedFields != nil || after.Annotations != nil || len(after.Labels) > 2 || after.Spec.Volumes != nil ||
				after.Spec.Containers[0].ReadinessProbe != nil || after.Status.PodIP != "" ||
				slices.ContainsFunc(after.Status.Conditions, func(c corev1.PodCondition) bool {
					return c.Type != corev1.PodReady || !c.LastTransitionTime.IsZero() || c.Reason != "" || c.Message != ""
				}) ||
				slices.ContainsFunc(after.Status.ContainerStatuses, func(c corev1.ContainerStatus) bool {
					return c.State.Running != nil && c.State.Running != &sharedRunning || c.State.Waiting != nil
				}) {
				t.Errorf("kept what the operator never reads: %+v", after)
			}
			if kept, whole := jsonSize(t, after), jsonSize(t, before); kept*2 > whole {
				t.Errorf("cached form %d bytes of the pod's %d: want at most half", kept, whole)
			}
			// The informer may transform an object twice (a watch list's objects are): the same.
			if again := cachedForm(after.DeepCopy()); !equality.Semantic.DeepEqual(again, after) {
				t.Errorf("cached form of the cached form = %+v, want %+v", again, after)
			}
		})
	}
	now := metav1.Now()
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data-kv-1", Namespace: "ns", UID: "claim-uid", CreationTimestamp: now,
			Labels:      map[string]string{specs.ClusterLabel: "kv", specs.ClusterUIDLabel: "cluster-uid"},
			Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes", "volume.kubernetes.io/selected-node": "node-1"},
			Finalizers:  []string{"kubernetes.io/pvc-protection"}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: new("fast"),
			VolumeName: "pvc-0123", VolumeMode: new(corev1.PersistentVolumeFilesystem),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Capacity:           corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AllocatedResources: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")},
			Conditions: []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimResizing, Status: corev1.ConditionFalse, LastTransitionTime: now},
				{Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue, LastTransitionTime: now}}},
	}
	kvcOfClaim, laterKVC := newKVCluster("ns", "kv", 3), newKVCluster("ns", "kv", 3)
	kvcOfClaim.UID, laterKVC.UID = "cluster-uid", "later-uid"
	before := claim.DeepCopy()
	after := cachedForm(claim).(*corev1.PersistentVolumeClaim)
	got, want := claimObserved(after), claimObserved(before)
	if !got.ResizePendingSince.Equal(want.ResizePendingSince) || want.ResizePendingSince.IsZero() {
		t.Errorf("claim's resize pending since %v, want %v", got.ResizePendingSince, want.ResizePendingSince)
	}
	got.ResizePendingSince, want.ResizePendingSince = time.Time{}, time.Time{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("claim observed = %+v, want %+v", got, want)
	}
	if !plan.ClaimBelongs(kvcOfClaim, after) || plan.ClaimBelongs(laterKVC, after) != plan.ClaimBelongs(laterKVC, before) {
		t.Error("the cached claim belongs to another cluster than the claim")
	}
	if after.Name != before.Name || after.UID != before.UID || !after.CreationTimestamp.Equal(&before.CreationTimestamp) ||
		!maps.Equal(after.Labels, before.Labels) || !slices.Equal(after.Finalizers, before.Finalizers) {
		t.Errorf("claim metadata = %+v, want %+v but its annotations", after.ObjectMeta, before.ObjectMeta)
	}
	if after.Annotations != nil || after.Spec.VolumeName != "" || after.Spec.AccessModes != nil || after.Status.AllocatedResources != nil ||
		len(after.Status.Conditions) != 1 {
		t.Errorf("kept what the operator never reads of a claim: %+v", after)
	}
	// Claims of a size share one list of it (its map: more than half of a claim's heap).
	other := before.DeepCopy()
	other.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi"), "example.com/iops": resource.MustParse("100")}
	otherAfter := cachedForm(other).(*corev1.PersistentVolumeClaim)
	if reflect.ValueOf(otherAfter.Status.Capacity).UnsafePointer() != reflect.ValueOf(after.Spec.Resources.Requests).UnsafePointer() ||
		len(otherAfter.Status.Capacity) != 1 {
		t.Errorf("the cached claims' lists of 2Gi are not one list of storage only: %v, %v", otherAfter.Status.Capacity, after.Spec.Resources.Requests)
	}
	if again := cachedForm(after.DeepCopy()); !equality.Semantic.DeepEqual(again, after) {
		t.Errorf("cached form of the cached claim = %+v, want %+v", again, after)
	}
	started, failed := metav1.NewTime(now.Add(-time.Minute)), metav1.NewTime(now.Truncate(time.Second))
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "kv-backup", UID: "job-uid", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}},
		Labels: map[string]string{specs.ClusterLabel: "kv", specs.BackupKindLabel: specs.BackupScheduled}, Annotations: map[string]string{specs.WritesFencedAnnotation: ""}},
		Spec: batchv1.JobSpec{BackoffLimit: new(int32(0)), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "backup", Env: []corev1.EnvVar{{Name: "A"}}}}}}},
		Status: batchv1.JobStatus{StartTime: &started, Failed: 1, UncountedTerminatedPods: &batchv1.UncountedTerminatedPods{},
			Conditions: []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, LastTransitionTime: failed, Reason: "DeadlineExceeded", Message: "Job was active longer than specified deadline"}}}}
	read := plan.NewJob(job.DeepCopy(), `{"error":"timed out"}`)
	gotJob := cachedForm(job.DeepCopy()).(*batchv1.Job)
	readCached := plan.NewJob(gotJob, `{"error":"timed out"}`)
	if readCached.Done != read.Done || readCached.Succeeded != read.Succeeded || !readCached.FinishedAt.Equal(read.FinishedAt) ||
		!equality.Semantic.DeepEqual(plan.BackupRecordOf(readCached), plan.BackupRecordOf(read)) || plan.JobFailureMessage(gotJob) != plan.JobFailureMessage(job) ||
		!equality.Semantic.DeepEqual(gotJob.ObjectMeta, func() metav1.ObjectMeta { m := job.ObjectMeta; m.ManagedFields = nil; return m }()) {
		t.Errorf("cached Job %+v reads otherwise than %+v", gotJob, job)
	}
	if !equality.Semantic.DeepEqual(gotJob.Spec, batchv1.JobSpec{}) || gotJob.Status.UncountedTerminatedPods != nil {
		t.Errorf("kept what the operator never reads of a Job: %+v", gotJob)
	}
	if again := cachedForm(gotJob.DeepCopy()); !equality.Semantic.DeepEqual(again, gotJob) {
		t.Errorf("cached form of the cached Job = %+v, want %+v", again, gotJob)
	}
}

// TestCachedIntentKeepsWhatTheOperatorReads: of the StatefulSet of a TLS cluster, the cache keeps
// what observe reads (the same observation comes out of it) and drops the rest of its spec, most
// of its size; of the other kinds the operator applies and reads only the metadata of, only that.
func TestCachedIntentKeepsWhatTheOperatorReads(t *testing.T) {
	kvc := newKVCluster("ns", "kv", 3)
	kvc.UID = "cluster-uid"
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	ours := []metav1.ManagedFieldsEntry{{Manager: specs.FieldManager, Operation: metav1.ManagedFieldsOperationApply, APIVersion: "apps/v1",
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:replicas":{}}}`)}}}
	var set appsv1.StatefulSet
	data, err := json.Marshal(specs.StatefulSet(kvc, specs.MemberSet{Replicas: 3, Images: specs.Images{EtcdRepository: "registry.k8s.io/etcd"},
		Trust: "ca-1", AwaitedPods: "1@2026-12-05T06:00:00Z@2026-12-05T06:01:00Z"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &set); err != nil {
		t.Fatal(err)
	}
	set.UID, set.ResourceVersion, set.Generation, set.ManagedFields = "set-uid", "7", 2, ours
	set.Status = appsv1.StatefulSetStatus{ObservedGeneration: 2, Replicas: 3, ReadyReplicas: 3, UpdateRevision: "kv-5d8f", CurrentRevision: "kv-5d8f"}
	before := set.DeepCopy()
	after := cachedIntent(&set).(*appsv1.StatefulSet)
	var got, want plan.Observation
	statefulSetObserved(after, &got)
	statefulSetObserved(before, &want)
	if want.STSTransport == nil || want.STSTLSSecrets == nil || want.STSQuota == 0 || want.STSTrust == "" || want.STSAwaitedPods == "" || want.STSClaimSize.IsZero() {
		t.Fatalf("the StatefulSet shows too little to check its cached form: %+v", want)
	}
	if got.STSClaimSize.Cmp(want.STSClaimSize) != 0 {
		t.Errorf("claim size of the cached StatefulSet = %s, want %s", &got.STSClaimSize, &want.STSClaimSize)
	}
	if shared := sharedStorage.of(before.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests); reflect.ValueOf(shared).UnsafePointer() !=
		reflect.ValueOf(after.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests).UnsafePointer() {
		t.Error("the cached StatefulSet's claim size is not the list its claims share")
	}
	got.STSClaimSize, want.STSClaimSize = resource.Quantity{}, resource.Quantity{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("observed of the cached StatefulSet = %+v, want %+v", got, want)
	}
	if !equality.Semantic.DeepEqual(after.Status, before.Status) || after.Generation != before.Generation || after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the cached StatefulSet lost its status or version: %+v", after)
	}
	if len(after.Spec.Template.Spec.InitContainers) != 0 || after.Spec.Template.Spec.Containers[0].ReadinessProbe != nil || after.Spec.Template.Spec.Containers[0].Image != "" {
		t.Errorf("kept what the operator never reads: %+v", after.Spec)
	}
	if kept, whole := jsonSize(t, after), jsonSize(t, before); kept*2 > whole {
		t.Errorf("cached form %d bytes of the StatefulSet's %d: want at most half", kept, whole)
	}
	if again := cachedIntent(after.DeepCopy()); !equality.Semantic.DeepEqual(again, after) {
		t.Errorf("cached form of the cached StatefulSet = %+v, want %+v", again, after)
	}
	now := metav1.Now()
	meta := func() metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: "kv-client", Namespace: "ns", UID: "uid", DeletionTimestamp: &now, ManagedFields: ours,
			Annotations:     map[string]string{specs.DrainedAtAnnotation: "2026-12-05T06:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "KVCluster", Name: "kv", UID: "cluster-uid", Controller: new(true)}}}
	}
	for _, tc := range []struct{ obj, want client.Object }{
		{&corev1.Service{ObjectMeta: meta(), Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "client", Port: 2379}}}},
			&corev1.Service{ObjectMeta: meta()}},
		{&policyv1.PodDisruptionBudget{ObjectMeta: meta(), Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: new(intstr.FromInt32(1))},
			Status: policyv1.PodDisruptionBudgetStatus{CurrentHealthy: 3}}, &policyv1.PodDisruptionBudget{ObjectMeta: meta()}},
		{&networkingv1.NetworkPolicy{ObjectMeta: meta(), Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
			&networkingv1.NetworkPolicy{ObjectMeta: meta()}},
	} {
		cached := cachedIntent(tc.obj).(client.Object)
		if cached.GetAnnotations()[intentAnnotation] == "" {
			t.Errorf("cached %T has no digest of the operator's intent", tc.obj)
		}
		delete(cached.GetAnnotations(), intentAnnotation)
		tc.want.SetManagedFields(nil)
		if !equality.Semantic.DeepEqual(cached, tc.want) {
			t.Errorf("cached %T = %+v, want only its metadata %+v", tc.obj, cached, tc.want)
		}
	}
}

func jsonSize(t *testing.T, v any) int {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return len(data)
}

// BenchmarkCachedMemberPod: the heap one member pod of a TLS cluster holds in the cache (three
// per cluster), whole as the informer decodes it (without managed fields) and in its cached form.
// The pod is the StatefulSet's template with the fields the API server and the kubelet add.
func BenchmarkCachedMemberPod(b *testing.B) {
	kvc := newKVCluster("ns", "kv", 3)
	kvc.UID = "cluster-uid"
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	data, err := json.Marshal(specs.StatefulSet(kvc, specs.MemberSet{Replicas: 3, Images: specs.Images{EtcdRepository: "registry.k8s.io/etcd"}}))
	if err != nil {
		b.Fatal(err)
	}
	var set appsv1.StatefulSet
	if err := json.Unmarshal(data, &set); err != nil {
		b.Fatal(err)
	}
	pod := corev1.Pod{ObjectMeta: set.Spec.Template.ObjectMeta, Spec: set.Spec.Template.Spec}
	pod.Name, pod.Namespace, pod.UID, pod.CreationTimestamp = "kv-1", "ns", "pod-uid", metav1.Now()
	pod.Labels[appsv1.StatefulSetRevisionLabel] = "kv-5d8f6c7b9"
	pod.Labels[appsv1.StatefulSetPodNameLabel], pod.Labels[appsv1.PodIndexLabel] = "kv-1", "1"
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "kv", UID: "set-uid"}}
	pod.Spec.NodeName, pod.Spec.ServiceAccountName, pod.Spec.DNSPolicy = "node-1", "default", corev1.DNSClusterFirst
	pod.Spec.Tolerations = []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}}}}}}})
	now := metav1.Now()
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "192.168.0.2", PodIP: "10.0.0.7", StartTime: &now,
		PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}}, HostIPs: []corev1.HostIP{{IP: "192.168.0.2"}}, QOSClass: corev1.PodQOSBurstable}
	for _, c := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image + "@sha256:0123456789abcdef",
			ContainerID: "containerd://0123456789abcdef", Ready: true, Started: new(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}})
	}
	data, err = json.Marshal(pod)
	if err != nil {
		b.Fatal(err)
	}
	benchmarkHeldHeap[corev1.Pod](b, data, "pod")
}

// BenchmarkCachedMemberClaim: the heap one member's data claim holds in the cache (three per
// cluster), whole as the informer decodes it (without managed fields) and in its cached form. The
// claim is the StatefulSet's claim template as the API server, the binder and the provisioner
// leave it once bound.
func BenchmarkCachedMemberClaim(b *testing.B) {
	kvc := newKVCluster("ns", "kv", 3)
	kvc.UID = "cluster-uid"
	set := specs.StatefulSet(kvc, specs.MemberSet{Replicas: 3})
	data, err := json.Marshal(set.Spec.VolumeClaimTemplates[0])
	if err != nil {
		b.Fatal(err)
	}
	var claim corev1.PersistentVolumeClaim
	if err := json.Unmarshal(data, &claim); err != nil {
		b.Fatal(err)
	}
	now := metav1.Now()
	claim.Name, claim.Namespace, claim.UID, claim.CreationTimestamp, claim.ResourceVersion = "data-kv-1", "ns", "claim-uid", now, "123456"
	claim.Annotations = map[string]string{"pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes",
		"volume.beta.kubernetes.io/storage-provisioner": "rancher.io/local-path", "volume.kubernetes.io/selected-node": "node-1"}
	claim.Finalizers = []string{"kubernetes.io/pvc-protection"}
	claim.Spec.VolumeName, claim.Spec.StorageClassName, claim.Spec.VolumeMode = "pvc-0123456789abcdef", new("standard"), new(corev1.PersistentVolumeFilesystem)
	claim.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, AccessModes: claim.Spec.AccessModes,
		Capacity: maps.Clone(claim.Spec.Resources.Requests)}
	if data, err = json.Marshal(claim); err != nil {
		b.Fatal(err)
	}
	benchmarkHeldHeap[corev1.PersistentVolumeClaim](b, data, "claim")
}

// BenchmarkCachedBackupJob: the heap one finished scheduled backup Job of a TLS cluster holds in
// the cache (a cluster keeps several: backup.jobHistoryLimit), whole as the informer decodes it
// (without managed fields) and in its cached form. The Job is as the operator applies it, with
// what the API server and the Job controller add.
func BenchmarkCachedBackupJob(b *testing.B) {
	kvc := newKVCluster("ns", "kv", 3)
	kvc.UID = "cluster-uid"
	kvc.Spec.TLS = &kvv1.TLSSpec{Mode: kvv1.TLSOperator}
	kvc.Spec.BackupSchedule = "0 * * * *"
	kvc.Spec.Backup = &kvv1.BackupSpec{S3: &kvv1.S3Destination{Endpoint: "https://s3.example.com", Bucket: "backups",
		Region: "eu-west-1", CredentialsSecret: "backup-credentials"}}
	data, err := json.Marshal(specs.BackupJob(kvc, specs.ScheduledBackupRun(kvc, "kv-1-29871234"), "example.com/kvcluster-operator:v1"))
	if err != nil {
		b.Fatal(err)
	}
	var job batchv1.Job
	if err := json.Unmarshal(data, &job); err != nil {
		b.Fatal(err)
	}
	now := metav1.Now()
	job.UID, job.CreationTimestamp, job.ResourceVersion, job.Generation = "job-uid", now, "123456", 1
	selector := map[string]string{batchv1.ControllerUidLabel: "job-uid"}
	job.Spec.Selector = &metav1.LabelSelector{MatchLabels: selector}
	job.Spec.Completions, job.Spec.Parallelism, job.Spec.ManualSelector = new(int32(1)), new(int32(1)), new(false)
	job.Spec.CompletionMode, job.Spec.Suspend = new(batchv1.NonIndexedCompletion), new(false)
	job.Spec.PodReplacementPolicy = new(batchv1.TerminatingOrFailed)
	job.Spec.Template.Labels[batchv1.ControllerUidLabel], job.Spec.Template.Labels[batchv1.JobNameLabel] = "job-uid", job.Name
	pod := &job.Spec.Template.Spec
	pod.DNSPolicy, pod.SchedulerName, pod.TerminationGracePeriodSeconds = corev1.DNSClusterFirst, corev1.DefaultSchedulerName, new(int64(30))
	for i := range pod.Containers {
		pod.Containers[i].TerminationMessagePath = corev1.TerminationMessagePathDefault
	}
	job.Status = batchv1.JobStatus{StartTime: &now, CompletionTime: &now, Succeeded: 1, Ready: new(int32(0)), Terminating: new(int32(0)),
		UncountedTerminatedPods: &batchv1.UncountedTerminatedPods{}, Conditions: []batchv1.JobCondition{
			{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now, Reason: "CompletionsReached", Message: "Reached expected number of succeeded pods"},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now, Reason: "CompletionsReached", Message: "Reached expected number of succeeded pods"}}}
	if data, err = json.Marshal(job); err != nil {
		b.Fatal(err)
	}
	benchmarkHeldHeap[batchv1.Job](b, data, "job")
}

// benchmarkHeldHeap measures the heap a thousand objects like the one data holds (the member
// kv-1 of cluster kv) hold, three members of each cluster, with their own names and UIDs: whole
// as decoded, and as the cache keeps them (its transform for the kind, with what it shares), in
// heap-B/<unit>.
func benchmarkHeldHeap[T any, PT interface {
	*T
	client.Object
}](b *testing.B, data []byte, unit string) {
	const objects = 1000
	variants := make([][]byte, objects)
	for i := range variants {
		cluster, member := i/3, i%3
		own := bytes.ReplaceAll(data, []byte("kv-1"), fmt.Appendf(nil, "kv%d-%d", cluster, member))
		own = bytes.ReplaceAll(own, []byte(`"kv-`), fmt.Appendf(nil, `"kv%d-`, cluster)) // its revision
		own = bytes.ReplaceAll(own, []byte(`"kv"`), fmt.Appendf(nil, `"kv%d"`, cluster))
		for _, uid := range []string{"pod-uid", "claim-uid"} {
			own = bytes.ReplaceAll(own, []byte(uid+`"`), fmt.Appendf(nil, `%s-%d"`, uid, i))
		}
		variants[i] = bytes.ReplaceAll(own, []byte(`-uid"`), fmt.Appendf(nil, `-uid-%d"`, cluster))
	}
	benchmarkHeld[T, PT](b, variants, 1, unit)
}

// benchmarkHeld measures the heap the objects encoded in variants hold, perUnit of them a unit:
// whole as decoded, and as the cache keeps them (its transform for the kind, with what it
// shares), in heap-B/<unit>; and their JSON's size, in json-B/<unit>.
func benchmarkHeld[T any, PT interface {
	*T
	client.Object
}](b *testing.B, variants [][]byte, perUnit int, unit string) {
	transform := cacheTransform(PT(new(T)))
	for _, form := range []struct {
		name   string
		cached func(PT) any
	}{{"whole", func(o PT) any { return o }}, {"cached", func(o PT) any { obj, _ := transform(o); return obj }}} {
		b.Run(form.name, func(b *testing.B) {
			var perObject float64
			for b.Loop() {
				held := make([]any, len(variants))
				resetShared() // what the objects share is held for them: measured from none
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				for i := range held {
					o := PT(new(T))
					if err := json.Unmarshal(variants[i], o); err != nil {
						b.Fatal(err)
					}
					held[i] = form.cached(o)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perObject = float64(after.HeapAlloc-before.HeapAlloc) / float64(len(variants))
				runtime.KeepAlive(held)
			}
			b.ReportMetric(perObject*float64(perUnit), "heap-B/"+unit)
			encoded := 0
			for _, v := range variants {
				encoded += len(v)
			}
			b.ReportMetric(float64(encoded*perUnit)/float64(len(variants)), "json-B/"+unit)
		})
	}
}

// BenchmarkCachedClusterSecrets: the heap a TLS cluster's four Secrets (its CA's, the members'
// server and peer certificates, the operator's client certificate) hold in the cache, as the
// operator issues them, each cluster with a CA of its own.
func BenchmarkCachedClusterSecrets(b *testing.B) {
	const clusters = 250
	var variants [][]byte
	for i := range clusters {
		for _, secret := range clusterTLSSecrets(b, fmt.Sprintf("kv%d", i)) {
			data, err := json.Marshal(secret)
			if err != nil {
				b.Fatal(err)
			}
			variants = append(variants, data)
		}
	}
	benchmarkHeld[corev1.Secret](b, variants, 4, "cluster")
}

// clusterTLSSecrets are the TLS Secrets of cluster name as the operator issues them (applyTLS):
// the CA's, then the server's, the peer's and the client's.
func clusterTLSSecrets(tb testing.TB, name string) []*corev1.Secret {
	tb.Helper()
	kvc := newKVCluster("ns", name, 3)
	kvc.UID = types.UID(name + "-uid")
	now := time.Now()
	ca, err := certs.NewCA("kvcluster-ca."+name+".ns", now, plan.CAValidity)
	if err != nil {
		tb.Fatal(err)
	}
	secret := func(part string, data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: specs.TLSSecretName(kvc, part), Namespace: "ns", UID: types.UID(name + "-" + part),
			Labels: specs.Labels(kvc), OwnerReferences: []metav1.OwnerReference{{APIVersion: "kvcluster.io/v1alpha1", Kind: "KVCluster", Name: name,
				UID: kvc.UID, Controller: new(true), BlockOwnerDeletion: new(true)}}},
			Type: corev1.SecretTypeTLS, Data: data}
	}
	secrets := []*corev1.Secret{secret(specs.TLSCA, map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM,
		specs.CACertKey: ca.CertPEM, specs.RotatedForKey: []byte("token")})}
	for _, part := range []struct {
		name  string
		usage certs.Usage
		names []string
	}{{specs.TLSServer, certs.Server, specs.ServerNames(kvc)}, {specs.TLSPeer, certs.Peer, specs.PeerNames(kvc)},
		{specs.TLSClient, certs.Client, []string{specs.ClientCommonName(kvc)}}} {
		leaf, err := ca.Issue(part.usage, part.names, now, plan.LeafValidity)
		if err != nil {
			tb.Fatal(err)
		}
		secrets = append(secrets, secret(part.name, map[string][]byte{corev1.TLSCertKey: leaf.CertPEM, corev1.TLSPrivateKeyKey: leaf.KeyPEM,
			specs.CACertKey: ca.CertPEM}))
	}
	return secrets
}

// cacheTransform is the transform of CacheOptions for objects of obj's kind.
func cacheTransform(obj client.Object) toolscache.TransformFunc {
	for kind, options := range CacheOptions().ByObject {
		if reflect.TypeOf(kind) == reflect.TypeOf(obj) {
			return options.Transform
		}
	}
	return nil
}

// TestSharedStorageIsBounded: past maxSharedSizes sizes a list is still right, just not shared,
// and a list without storage is none.
func TestSharedStorageIsBounded(t *testing.T) {
	lists := storageLists{lists: map[string]corev1.ResourceList{}}
	for i := range maxSharedSizes + 10 {
		size := *resource.NewQuantity(int64(i+1)<<20, resource.BinarySI)
		got := lists.of(corev1.ResourceList{corev1.ResourceStorage: size})
		if q := got[corev1.ResourceStorage]; q.Cmp(size) != 0 || len(got) != 1 {
			t.Fatalf("list of %s = %v", size.String(), got)
		}
	}
	if len(lists.lists) != maxSharedSizes {
		t.Errorf("%d sizes held, want %d", len(lists.lists), maxSharedSizes)
	}
	if got := lists.of(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}); got != nil {
		t.Errorf("list without storage = %v, want none", got)
	}
}

// TestSharingMetadata: cached objects' metadata are equal to what was decoded, but a cluster's
// objects share one copy of its strings, and all but pods one map of a set of labels.
func TestSharingMetadata(t *testing.T) {
	table := newMetadataTable() // the cache's is shared with this package's other tests
	decoded := func(obj client.Object) client.Object { return decodedCopy(t, obj) }
	kvc := newKVCluster("ns", "kv", 3)
	kvc.UID = "cluster-uid"
	owner := []metav1.OwnerReference{{APIVersion: "kvcluster.io/v1alpha1", Kind: "KVCluster", Name: "kv", UID: "cluster-uid", Controller: new(true), BlockOwnerDeletion: new(true)}}
	meta := func(name string, labels map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name + "-uid"), Labels: labels, OwnerReferences: owner,
			Annotations: map[string]string{"example.com/note": name}, Finalizers: []string{"kubernetes.io/pvc-protection"}}
	}
	podLabels := func(revision string) map[string]string { // as cachedForm leaves them
		return map[string]string{specs.ClusterLabel: "kv", appsv1.StatefulSetRevisionLabel: revision}
	}
	objects := []client.Object{
		&corev1.PersistentVolumeClaim{ObjectMeta: meta("data-kv-0", specs.Labels(kvc))},
		&corev1.PersistentVolumeClaim{ObjectMeta: meta("data-kv-1", specs.Labels(kvc))},
		&corev1.Service{ObjectMeta: meta("kv", specs.Labels(kvc))},
		&corev1.Pod{ObjectMeta: meta("kv-0", podLabels("kv-5d8f"))},
		&corev1.Pod{ObjectMeta: meta("kv-1", podLabels("kv-5d8f"))},
		&corev1.Pod{ObjectMeta: meta("kv-2", podLabels("kv-7c6b"))}, // made from the next revision
	}
	var cached []client.Object
	for _, obj := range objects {
		o := decoded(obj)
		before := o.DeepCopyObject()
		after := table.share(o).(client.Object)
		if !equality.Semantic.DeepEqual(after, before) {
			t.Fatalf("%s changed: %+v, want %+v", obj.GetName(), after, before)
		}
		if again := table.share(after.DeepCopyObject()); !equality.Semantic.DeepEqual(again, after) {
			t.Errorf("%s shared twice = %+v, want %+v", obj.GetName(), again, after)
		}
		cached = append(cached, after)
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	first := cached[0]
	for _, o := range cached[1:] {
		if !same(o.GetNamespace(), first.GetNamespace()) || !same(o.GetLabels()[specs.ClusterLabel], first.GetLabels()[specs.ClusterLabel]) ||
			!same(string(o.GetOwnerReferences()[0].UID), string(first.GetOwnerReferences()[0].UID)) ||
			!same(o.GetOwnerReferences()[0].Kind, first.GetOwnerReferences()[0].Kind) || !same(o.GetFinalizers()[0], first.GetFinalizers()[0]) ||
			!same(o.GetOwnerReferences()[0].APIVersion, first.GetOwnerReferences()[0].APIVersion) ||
			!same(o.GetOwnerReferences()[0].Name, first.GetOwnerReferences()[0].Name) ||
			o.GetOwnerReferences()[0].Controller != first.GetOwnerReferences()[0].Controller ||
			o.GetOwnerReferences()[0].BlockOwnerDeletion != first.GetOwnerReferences()[0].BlockOwnerDeletion ||
			!same(slices.Collect(maps.Keys(o.GetAnnotations()))[0], slices.Collect(maps.Keys(first.GetAnnotations()))[0]) {
			t.Errorf("%s does not share the cluster's strings with %s", o.GetName(), first.GetName())
		}
		if same(o.GetName(), first.GetName()) {
			t.Errorf("%s shares its name", o.GetName())
		}
	}
	mapOf := func(o client.Object) unsafe.Pointer { return reflect.ValueOf(o.GetLabels()).UnsafePointer() }
	if mapOf(cached[0]) != mapOf(cached[1]) || mapOf(cached[0]) != mapOf(cached[2]) {
		t.Error("claims and Service of one cluster do not share their set of labels")
	}
	if mapOf(cached[3]) != mapOf(cached[4]) || mapOf(cached[3]) == mapOf(cached[5]) {
		t.Error("member pods of one revision do not share their set of labels, or pods of two revisions do")
	}
	if n := len(slices.Concat(slices.Collect(maps.Values(table.labels))...)); n != 3 {
		t.Errorf("%d sets of labels held, want 3: the cluster's objects', and its pods' of each revision", n)
	}

	// Past its bound the table starts afresh: what is cached keeps its copies.
	table.bytes = maxSharedMetadataBytes
	o := table.share(decoded(objects[0])).(client.Object)
	if mapOf(o) == mapOf(cached[0]) || !maps.Equal(o.GetLabels(), cached[0].GetLabels()) || len(table.strings) > 20 {
		t.Errorf("table past its bound: %d strings, labels %v shared %v", len(table.strings), o.GetLabels(), mapOf(o) == mapOf(cached[0]))
	}
}

// TestSharingCAs: a cluster's cached TLS Secrets hold what was decoded, but one copy of its CA's
// certificate (each Secret's ca.crt, and the CA's own tls.crt); nothing else is shared, and the
// table holds no key. Another cluster's CA is another copy; past its bound the table starts
// afresh.
func TestSharingCAs(t *testing.T) {
	table := newCertificateTable() // the cache's is shared with this package's other tests
	decoded := func(secret *corev1.Secret) *corev1.Secret { return decodedCopy(t, secret) }
	share := func(secret *corev1.Secret) *corev1.Secret {
		t.Helper()
		before := secret.DeepCopy()
		table.share(secret)
		if !equality.Semantic.DeepEqual(secret, before) {
			t.Fatalf("%s changed: %+v, want %+v", secret.Name, secret, before)
		}
		again := secret.DeepCopy()
		if table.share(again); !equality.Semantic.DeepEqual(again, secret) {
			t.Errorf("%s shared twice = %+v, want %+v", secret.Name, again, secret)
		}
		return secret
	}
	same := func(a, b []byte) bool { return unsafe.SliceData(a) == unsafe.SliceData(b) }

	var cached []*corev1.Secret
	for _, secret := range clusterTLSSecrets(t, "kv") {
		cached = append(cached, share(decoded(secret)))
	}
	ca := cached[0].Data[specs.CACertKey]
	for _, secret := range cached {
		if !same(secret.Data[specs.CACertKey], ca) {
			t.Errorf("%s does not share its CA's certificate", secret.Name)
		}
	}
	if !same(cached[0].Data[corev1.TLSCertKey], ca) {
		t.Error("the CA's Secret holds its certificate twice")
	}
	for _, secret := range cached[1:] {
		if same(secret.Data[corev1.TLSCertKey], ca) || same(secret.Data[corev1.TLSPrivateKeyKey], cached[0].Data[corev1.TLSPrivateKeyKey]) {
			t.Errorf("%s shares its own certificate or key with the CA's", secret.Name)
		}
	}
	held := func() [][]byte { return slices.Concat(slices.Collect(maps.Values(table.pems))...) }
	if got := held(); len(got) != 1 || !same(got[0], ca) {
		t.Errorf("the table holds %d values, want the CA's certificate alone", len(got))
	}

	other := share(decoded(clusterTLSSecrets(t, "other")[1]))
	if same(other.Data[specs.CACertKey], ca) || len(held()) != 2 {
		t.Errorf("another cluster's CA: shared with kv's %v, %d values held, want 2", same(other.Data[specs.CACertKey], ca), len(held()))
	}
	plain := share(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "opaque"}, Data: map[string][]byte{"password": []byte("x")}})
	if len(held()) != 2 || string(plain.Data["password"]) != "x" {
		t.Errorf("a Secret without ca.crt: %d values held, data %v", len(held()), plain.Data)
	}

	// Past its bound the table starts afresh: what is cached keeps its copy.
	table.bytes = maxSharedCABytes
	again := share(decoded(cached[1]))
	if same(again.Data[specs.CACertKey], ca) || len(held()) != 1 {
		t.Errorf("table past its bound: %d values held, shared with the old copy %v", len(held()), same(again.Data[specs.CACertKey], ca))
	}
	if !bytes.Equal(ca, cached[1].Data[specs.CACertKey]) {
		t.Error("a cached Secret's CA certificate changed when the table started afresh")
	}

	// The cache's transform for Secrets shares them.
	transform := cacheTransform(&corev1.Secret{})
	var viaCache []*corev1.Secret
	for _, secret := range clusterTLSSecrets(t, "kv") {
		obj, err := transform(decoded(secret))
		if err != nil {
			t.Fatal(err)
		}
		viaCache = append(viaCache, obj.(*corev1.Secret))
	}
	if !same(viaCache[0].Data[specs.CACertKey], viaCache[3].Data[specs.CACertKey]) {
		t.Error("the cache's transform does not share a cluster's CA certificate")
	}
}

// decodedCopy is obj encoded and decoded again: equal, with its own copy of every string, map
// and byte slice, as the informer's decoding gives them.
func decodedCopy[T client.Object](t *testing.T, obj T) T {
	t.Helper()
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	copied := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(T)
	if err := json.Unmarshal(data, copied); err != nil {
		t.Fatal(err)
	}
	return copied
}

// resetShared empties what the cached objects share (benchmarks measure what they hold from none).
func resetShared() {
	sharedMetadata.mu.Lock()
	sharedMetadata.strings, sharedMetadata.labels, sharedMetadata.bytes = map[string]string{}, map[uint64][]map[string]string{}, 0
	sharedMetadata.mu.Unlock()
	sharedStorage.mu.Lock()
	sharedStorage.lists = map[string]corev1.ResourceList{}
	sharedStorage.mu.Unlock()
	sharedCAs.mu.Lock()
	sharedCAs.pems, sharedCAs.bytes = map[uint64][][]byte{}, 0
	sharedCAs.mu.Unlock()
}
