package specs

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// nonRootUID is the user etcd runs as; the official image has no user of its own.
const nonRootUID = 65532

// autoCompaction is the cluster's etcd auto-compaction mode and retention, defaults filled in.
func autoCompaction(kvc *kvv1.KVCluster) (mode, retention string) {
	ac := kvc.Spec.Space.AutoCompaction
	if ac.Mode == kvv1.AutoCompactionRevision {
		return "revision", cmp.Or(ac.Retention, "10000")
	}
	return "periodic", cmp.Or(ac.Retention, "1h")
}

// Images are the images members run: etcd from EtcdRepository (unless the cluster names its own),
// and the operator's own image for the restore program.
type Images struct {
	EtcdRepository string
	Operator       string
}

// MemberSet is what the StatefulSet depends on besides the KVCluster.
type MemberSet struct {
	Images Images
	// Replicas is how many members the operator lets run: during membership changes it moves one
	// member at a time, ahead of or behind spec.partitions.
	Replicas int32
	// Bootstrapping: the cluster has not formed yet. Only then do members restore spec.restore's
	// backup; members started later (scaled up, replaced, upgraded) join the running cluster
	// and must not need the backup's store, its credentials or its claim.
	Bootstrapping bool
	// Guard is the UID of the cluster's deletion guard, if it has one.
	Guard types.UID
	// UnlabelledClaims keeps the claim template of a StatefulSet made by an earlier release, whose
	// claims do not carry the cluster's UID: a StatefulSet's claim templates cannot change.
	UnlabelledClaims bool
	// Trust identifies the CAs members trust (TrustAnnotation): etcd loads its trusted CA files
	// only at start, so a change of them changes the template, and members restart one at a time.
	Trust string
	// Transport is how members listen (see Transport): the spec's (also when left zero, which
	// would have no client listener), or a step towards it.
	Transport Transport
	// ClaimSize is the size the claim template asks for: storage.size when the StatefulSet was
	// made (its claim templates cannot change; the operator expands the claims themselves). Zero:
	// storage.size.
	ClaimSize resource.Quantity
	// Quota is the backend quota members run with, in bytes (zero: QuotaBackendBytes of
	// storage.size): while volumes are expanded, one the volumes they have hold.
	Quota int64
	// AwaitedPods is the value of AwaitedPodsAnnotation ("": none).
	AwaitedPods string
}

// AwaitedPodsAnnotation on the StatefulSet names the member pods that have neither pod nor claim
// (ordinals, when first awaited and last named: "1@<time>@<time>"), as after a volume reset or a
// claim deleted with its pod. The StatefulSet controller fails to make such a pod while the old
// claim is being deleted, then retries with a backoff that grows to 1000 s, and it watches no
// claims: a new value of this annotation is a change it watches, so it makes the pod and its
// claim as soon as the old claim is gone. The value stays once the pods are back.
const AwaitedPodsAnnotation = "kvcluster.io/awaited-pods"

// TrustAnnotation on the members' pod template identifies the CA bundle they trust.
const TrustAnnotation = "kvcluster.io/trusted-ca"

// StatefulSet runs the members, one etcd member per pod.
//
// updateStrategy is OnDelete so that the operator, not the StatefulSet controller, chooses which
// member restarts when: a rolling update that ignores etcd's health can lose quorum.
// podManagementPolicy is Parallel because a new cluster's members must all start to form a quorum.
// Volumes of scaled-away members are deleted (a removed member's data would make a re-added
// member crash on stale membership); volumes are retained when the whole cluster is deleted.
func StatefulSet(kvc *kvv1.KVCluster, set MemberSet) *appsv1ac.StatefulSetApplyConfiguration {
	sts := appsv1ac.StatefulSet(kvc.Name, kvc.Namespace)
	if set.AwaitedPods != "" {
		sts.WithAnnotations(map[string]string{AwaitedPodsAnnotation: set.AwaitedPods})
	}
	return sts.
		WithLabels(Labels(kvc)).
		WithOwnerReferences(Owners(kvc, set.Guard)...).
		WithSpec(appsv1ac.StatefulSetSpec().
			WithReplicas(set.Replicas).
			WithServiceName(PeerServiceName(kvc)).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(SelectorLabels(kvc))).
			WithPodManagementPolicy(appsv1.ParallelPodManagement).
			WithUpdateStrategy(appsv1ac.StatefulSetUpdateStrategy().WithType(appsv1.OnDeleteStatefulSetStrategyType)).
			WithPersistentVolumeClaimRetentionPolicy(appsv1ac.StatefulSetPersistentVolumeClaimRetentionPolicy().
				WithWhenDeleted(appsv1.RetainPersistentVolumeClaimRetentionPolicyType).
				WithWhenScaled(appsv1.DeletePersistentVolumeClaimRetentionPolicyType)).
			WithTemplate(podTemplate(kvc, set)).
			WithVolumeClaimTemplates(volumeClaimTemplate(kvc, set.ClaimSize, !set.UnlabelledClaims)))
}

func podTemplate(kvc *kvv1.KVCluster, set MemberSet) *corev1ac.PodTemplateSpecApplyConfiguration {
	img := set.Images
	if set.Transport == (Transport{}) {
		set.Transport = DesiredTransport(kvc)
	}
	spec := corev1ac.PodTemplateSpec().
		WithLabels(Labels(kvc)).
		WithSpec(corev1ac.PodSpec().
			// etcd never talks to the Kubernetes API.
			WithAutomountServiceAccountToken(false).
			WithEnableServiceLinks(false).
			WithSecurityContext(corev1ac.PodSecurityContext().
				WithRunAsNonRoot(true).
				WithRunAsUser(nonRootUID).
				WithRunAsGroup(nonRootUID).
				WithFSGroup(nonRootUID).
				WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault))).
			WithContainers(etcdContainer(kvc, img.EtcdRepository, set.Transport, set.Quota)))
	placeMembers(kvc, spec)
	if set.Transport.UsesTLS() {
		spec.Spec.WithVolumes(tlsVolume(kvc, TLSServer), tlsVolume(kvc, TLSPeer))
	}
	if set.Trust != "" {
		spec.WithAnnotations(map[string]string{TrustAnnotation: set.Trust})
	}
	if kvc.Spec.Restore != nil && set.Bootstrapping {
		spec.Spec.WithInitContainers(restoreInitContainers(kvc, img)...).WithVolumes(restoreVolumes(kvc)...)
	}
	return spec
}

// etcdContainerName is the member pod's etcd container.
const etcdContainerName = "etcd"

func etcdContainer(kvc *kvv1.KVCluster, defaultRepository string, t Transport, quota int64) *corev1ac.ContainerApplyConfiguration {
	c := corev1ac.Container().
		WithName(etcdContainerName).
		WithImage(Image(kvc, defaultRepository)).
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithCommand("/usr/local/bin/etcd").
		WithArgs(EtcdArgs(kvc, t, quota)...).
		WithEnv(podNameEnv()).
		WithEnv(membershipEnv(kvc)...).
		WithPorts(
			containerPort("client", ClientPort),
			containerPort("peer", PeerPort),
			containerPort("metrics", MetricsPort),
		).
		WithVolumeMounts(corev1ac.VolumeMount().WithName(dataVolume).WithMountPath(dataMount)).
		// A bootstrapping member waits for its peers' DNS names and for a quorum; give it time.
		WithStartupProbe(probe("/livez").WithPeriodSeconds(5).WithFailureThreshold(60)).
		WithLivenessProbe(probe("/livez").WithPeriodSeconds(10).WithFailureThreshold(6)).
		WithReadinessProbe(probe("/readyz").WithPeriodSeconds(5).WithFailureThreshold(3)).
		WithSecurityContext(restrictedContainer())
	if t.UsesTLS() {
		c.WithVolumeMounts(tlsMountOf(TLSServer), tlsMountOf(TLSPeer))
	}
	if r := kvc.Spec.Resources; len(r.Limits) > 0 || len(r.Requests) > 0 {
		rr := corev1ac.ResourceRequirements()
		if len(r.Limits) > 0 {
			rr.WithLimits(r.Limits)
		}
		if len(r.Requests) > 0 {
			rr.WithRequests(r.Requests)
		}
		c.WithResources(rr)
	}
	return c
}

// EtcdArgs are the etcd server flags of every member, listening as t, with a backend quota of
// quota bytes (zero: QuotaBackendBytes of storage.size). $(POD_NAME) is expanded by the kubelet.
// No --experimental-* flag is used: etcd 3.7 removed them all and refuses to start with one. The
// initial cluster and its state come from the environment (membershipEnv).
func EtcdArgs(kvc *kvv1.KVCluster, t Transport, quota int64) []string {
	if quota == 0 {
		quota = QuotaBackendBytes(kvc, resource.Quantity{})
	}
	self := selfHost(kvc)
	args := []string{
		"--name=$(POD_NAME)",
		"--data-dir=" + dataDir,
		"--listen-client-urls=" + t.clientURLs("0.0.0.0"),
		"--listen-peer-urls=" + t.peerURL("0.0.0.0"),
		// Plain HTTP: the probes and metrics scrapers read it; it serves no keys.
		fmt.Sprintf("--listen-metrics-urls=http://0.0.0.0:%d", MetricsPort),
		"--advertise-client-urls=" + t.clientURLs(self),
		"--initial-advertise-peer-urls=" + t.peerURL(self),
		"--initial-cluster-token=" + clusterToken(kvc),
		quotaFlag + strconv.FormatInt(quota, 10),
	}
	// Old history is compacted away, so the database does not grow without bound.
	mode, retention := autoCompaction(kvc)
	args = append(args, "--auto-compaction-mode="+mode, "--auto-compaction-retention="+retention)
	args = append(args, walArgs()...)
	return append(args, etcdTLSArgs(kvc, t)...)
}

// selfHost is the member's own DNS name, with $(POD_NAME) expanded by the kubelet.
func selfHost(kvc *kvv1.KVCluster) string {
	return fmt.Sprintf("$(POD_NAME).%s.%s.svc", PeerServiceName(kvc), kvc.Namespace)
}

func selfPeerURL(kvc *kvv1.KVCluster) string { return DesiredTransport(kvc).peerURL(selfHost(kvc)) }

// clusterToken keeps members of different clusters from ever joining each other.
func clusterToken(kvc *kvv1.KVCluster) string { return kvc.Namespace + "-" + kvc.Name }

// StorageSize is the requested size of each member's volume (the API defaults it to 1Gi).
func StorageSize(kvc *kvv1.KVCluster) resource.Quantity {
	if kvc.Spec.Storage.Size.IsZero() {
		return resource.MustParse("1Gi")
	}
	return kvc.Spec.Storage.Size
}

// ClusterUIDLabel on a member's claim names the KVCluster incarnation it was made for, so a
// cluster re-created under the same name recognises the volumes an earlier one left behind.
const ClusterUIDLabel = "kvcluster.io/cluster-uid"

func volumeClaimTemplate(kvc *kvv1.KVCluster, size resource.Quantity, labelUID bool) *corev1ac.PersistentVolumeClaimApplyConfiguration {
	if size.IsZero() {
		size = StorageSize(kvc)
	}
	spec := corev1ac.PersistentVolumeClaimSpec().
		WithAccessModes(corev1.ReadWriteOnce).
		WithVolumeMode(corev1.PersistentVolumeFilesystem).
		WithResources(corev1ac.VolumeResourceRequirements().
			WithRequests(corev1.ResourceList{corev1.ResourceStorage: size}))
	if sc := kvc.Spec.Storage.StorageClassName; sc != "" {
		spec.WithStorageClassName(sc)
	}
	// A template carries no namespace: the constructor would set an empty one. volumeClaimTemplates
	// is an atomic list, so the values the API server defaults inside it (volumeMode, status.phase)
	// become ours; stating them keeps the desired object equal to the stored one.
	labels := Labels(kvc)
	if labelUID {
		labels[ClusterUIDLabel] = string(kvc.UID)
	}
	return (&corev1ac.PersistentVolumeClaimApplyConfiguration{}).
		WithName(dataVolume).
		WithLabels(labels).
		WithSpec(spec).
		WithStatus(corev1ac.PersistentVolumeClaimStatus().WithPhase(corev1.ClaimPending))
}

// PodQuota is the backend quota the pod template gives etcd, in bytes (read from the StatefulSet:
// the manager's cache keeps no such flag of a pod).
func PodQuota(pod corev1.PodSpec) (int64, bool) {
	for _, c := range pod.Containers {
		if c.Name != etcdContainerName {
			continue
		}
		for _, arg := range c.Args {
			if q, ok := strings.CutPrefix(arg, quotaFlag); ok {
				n, err := strconv.ParseInt(q, 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}

const quotaFlag = "--quota-backend-bytes="

// TemplateArgs are the arguments of a container of the members' pod template that PodTransport
// and PodQuota read (the manager's cache keeps only these of the StatefulSet's).
func TemplateArgs(args []string) []string {
	kept := TransportArgs(args)
	for _, arg := range args {
		if strings.HasPrefix(arg, quotaFlag) {
			kept = append(kept, arg)
		}
	}
	return kept
}

// MemberClaim is what the operator owns of a member's data claim, which the StatefulSet (or a
// person) made: the label naming the cluster it belongs to and the size it asks for (zero: not
// applied). They are applied together because an apply gives up the fields of an earlier one by
// the same manager that it leaves out: the size of a claim the operator expanded would be removed.
// The UID (when known) is a precondition, so a claim deleted meanwhile is never re-created.
func MemberClaim(kvc *kvv1.KVCluster, name string, uid types.UID, size resource.Quantity) *corev1ac.PersistentVolumeClaimApplyConfiguration {
	claim := corev1ac.PersistentVolumeClaim(name, kvc.Namespace).
		WithLabels(map[string]string{ClusterUIDLabel: string(kvc.UID)})
	if uid != "" {
		claim.WithUID(uid)
	}
	if !size.IsZero() {
		claim.WithSpec(corev1ac.PersistentVolumeClaimSpec().WithResources(corev1ac.VolumeResourceRequirements().
			WithRequests(corev1.ResourceList{corev1.ResourceStorage: size})))
	}
	return claim
}

func containerPort(name string, port int32) *corev1ac.ContainerPortApplyConfiguration {
	return corev1ac.ContainerPort().WithName(name).WithContainerPort(port).WithProtocol(corev1.ProtocolTCP)
}

func probe(path string) *corev1ac.ProbeApplyConfiguration {
	return corev1ac.Probe().
		WithHTTPGet(corev1ac.HTTPGetAction().WithPath(path).WithPort(intstr.FromString("metrics")).WithScheme(corev1.URISchemeHTTP)).
		WithTimeoutSeconds(5)
}
