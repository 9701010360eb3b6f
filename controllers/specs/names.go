// Package specs builds the desired state of every object a KVCluster owns, as typed apply
// configurations. Its functions are pure (no client, no I/O): the controller decides when to apply,
// these decide what.
package specs

import (
	"fmt"
	"maps"
	"strings"

	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

const (
	// FieldManager is the single field manager every write of the operator uses.
	FieldManager = "kvcluster-operator"
	// LeaderElectionID names the Lease the operator's replicas elect their leader with.
	LeaderElectionID = "kvcluster-operator.kvcluster.io"

	// ManagedByLabel marks every object the operator owns; the manager's cache selects on it, so it
	// never holds unrelated Pods, StatefulSets or Jobs.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "kvcluster-operator"
	// ClusterLabel names the KVCluster an object belongs to.
	ClusterLabel = "kvcluster.io/cluster"
	nameLabel    = "app.kubernetes.io/name"
	nameValue    = "kvcluster"
	instanceLbl  = "app.kubernetes.io/instance"

	// DefaultEtcdRepository is the official etcd image repository.
	DefaultEtcdRepository = "gcr.io/etcd-development/etcd"

	ClientPort  = 2379
	PeerPort    = 2380
	MetricsPort = 2381

	dataVolume = "data"
	dataMount  = "/var/lib/etcd"
	dataDir    = dataMount + "/data"
)

// PeerServiceName is the headless Service giving each member a stable DNS name.
func PeerServiceName(kvc *kvv1.KVCluster) string { return kvc.Name + "-peer" }

// ClientServiceName is the Service clients connect to.
func ClientServiceName(kvc *kvv1.KVCluster) string { return kvc.Name + "-client" }

// MemberName is the name of the member (and its pod) with the given StatefulSet ordinal.
func MemberName(kvc *kvv1.KVCluster, ordinal int) string {
	return fmt.Sprintf("%s-%d", kvc.Name, ordinal)
}

// DataClaimName is the PersistentVolumeClaim the StatefulSet creates for a member's data.
func DataClaimName(kvc *kvv1.KVCluster, ordinal int) string {
	return dataVolume + "-" + MemberName(kvc, ordinal)
}

// OrdinalOfClaim is the ordinal of the member whose data claim has the given name.
func OrdinalOfClaim(kvc *kvv1.KVCluster, name string) (int, bool) {
	member, ok := strings.CutPrefix(name, dataVolume+"-")
	if !ok {
		return 0, false
	}
	return OrdinalOfMember(kvc, member)
}

// memberHost is a member's DNS name relative to the cluster domain, so it works whatever the
// cluster domain is (pods resolve it through their search path).
func memberHost(kvc *kvv1.KVCluster, member string) string {
	return fmt.Sprintf("%s.%s.%s.svc", member, PeerServiceName(kvc), kvc.Namespace)
}

// MemberClientURL is the URL of one member's client port in a scheme (http or https) it accepts.
func MemberClientURL(kvc *kvv1.KVCluster, scheme string, ordinal int) string {
	return fmt.Sprintf("%s://%s:%d", scheme, memberHost(kvc, MemberName(kvc, ordinal)), ClientPort)
}

// MemberClientURLs lists the client URLs of all desired members in a scheme.
func MemberClientURLs(kvc *kvv1.KVCluster, scheme string) []string {
	urls := make([]string, 0, kvc.Spec.Partitions)
	for i := range int(kvc.Spec.Partitions) {
		urls = append(urls, MemberClientURL(kvc, scheme, i))
	}
	return urls
}

// ClientEndpoint is the URL of the client Service in a scheme.
func ClientEndpoint(kvc *kvv1.KVCluster, scheme string) string {
	return fmt.Sprintf("%s://%s.%s.svc:%d", scheme, ClientServiceName(kvc), kvc.Namespace, ClientPort)
}

// Image is the etcd image of the cluster's version.
func Image(kvc *kvv1.KVCluster, defaultRepository string) string {
	repo := kvc.Spec.Repository
	if repo == "" {
		repo = defaultRepository
	}
	if repo == "" {
		repo = DefaultEtcdRepository
	}
	return fmt.Sprintf("%s:v%s", repo, kvc.Spec.Version)
}

// SelectorLabels select the member pods of one cluster. They are part of the StatefulSet's
// immutable selector, so they never change.
func SelectorLabels(kvc *kvv1.KVCluster) map[string]string {
	return map[string]string{nameLabel: nameValue, instanceLbl: kvc.Name}
}

// Labels are put on every owned object. The KVCluster's own labels are deliberately not copied:
// GitOps tools track objects by label and would adopt or prune the children.
func Labels(kvc *kvv1.KVCluster) map[string]string {
	l := SelectorLabels(kvc)
	l[ManagedByLabel] = ManagedByValue
	l[ClusterLabel] = kvc.Name
	return l
}

// JobPodLabels are the labels of the pods of the cluster's Jobs (backups, deregistration): the
// labels of the Job without the instance label, so that no member selector (the StatefulSet's,
// the Services', the PodDisruptionBudget's) takes them for members. The disruption controller
// would otherwise count them and, a Job having no scale subresource, allow no disruption at all.
func JobPodLabels(jobLabels map[string]string) map[string]string {
	l := maps.Clone(jobLabels)
	delete(l, instanceLbl)
	return l
}

// OwnerReference makes the KVCluster the controller of an owned object, so deleting it collects them.
func OwnerReference(kvc *kvv1.KVCluster) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion(kvv1.GroupVersion.String()).
		WithKind("KVCluster").
		WithName(kvc.Name).
		WithUID(kvc.UID).
		WithController(true).
		WithBlockOwnerDeletion(true)
}

// secretEnv maps one key of a Secret into an environment variable of the same name.
func secretEnv(secret, key string) *corev1ac.EnvVarApplyConfiguration {
	return corev1ac.EnvVar().WithName(key).WithValueFrom(corev1ac.EnvVarSource().
		WithSecretKeyRef(corev1ac.SecretKeySelector().WithName(secret).WithKey(key)))
}

// podNameEnv gives a container its pod's name as $(POD_NAME).
func podNameEnv() *corev1ac.EnvVarApplyConfiguration {
	return corev1ac.EnvVar().WithName("POD_NAME").WithValueFrom(corev1ac.EnvVarSource().
		WithFieldRef(corev1ac.ObjectFieldSelector().WithAPIVersion("v1").WithFieldPath("metadata.name")))
}

// restrictedContainer is the container security context of the restricted Pod Security Standard.
func restrictedContainer() *corev1ac.SecurityContextApplyConfiguration {
	return corev1ac.SecurityContext().
		WithAllowPrivilegeEscalation(false).
		WithReadOnlyRootFilesystem(true).
		WithRunAsNonRoot(true).
		WithCapabilities(corev1ac.Capabilities().WithDrop("ALL"))
}

// restrictedPod is the pod security context of the restricted Pod Security Standard.
func restrictedPod() *corev1ac.PodSecurityContextApplyConfiguration {
	return corev1ac.PodSecurityContext().
		WithRunAsNonRoot(true).
		WithRunAsUser(nonRootUID).
		WithRunAsGroup(nonRootUID).
		WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault))
}
