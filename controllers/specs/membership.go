package specs

import (
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// etcd's bootstrap settings of a member that starts without data. They live in a ConfigMap, not
// in the pod template, because they change with the membership (a member joining a running
// cluster must be given exactly its current member list) and a template change would mark every
// pod as outdated. The kubelet resolves the values each time it starts the container.
const (
	keyInitialCluster      = "initial-cluster"
	keyInitialClusterState = "initial-cluster-state"
	envInitialCluster      = "ETCD_INITIAL_CLUSTER"
	envInitialClusterState = "ETCD_INITIAL_CLUSTER_STATE"

	ClusterStateNew      = "new"
	ClusterStateExisting = "existing"
)

// Membership is what a member starting without data is told about the cluster.
type Membership struct {
	// State is "new" while the cluster is being formed, "existing" once it has been.
	State string
	// Ordinals are the members of the cluster, by StatefulSet ordinal.
	Ordinals []int
	// PeerURLs are the members' peer URLs as etcd has them, where they are not the spec's (a
	// cluster moving to TLS has both schemes): a joining member must be told exactly those.
	PeerURLs map[int]string
}

// NewClusterMembership is the membership of a cluster being formed: all its partitions at once.
func NewClusterMembership(kvc *kvv1.KVCluster) Membership {
	m := Membership{State: ClusterStateNew}
	for i := range int(kvc.Spec.Partitions) {
		m.Ordinals = append(m.Ordinals, i)
	}
	return m
}

// MembershipConfigMapName is the ConfigMap holding a cluster's Membership.
func MembershipConfigMapName(kvc *kvv1.KVCluster) string { return kvc.Name + "-members" }

// MembershipConfigMap holds etcd's --initial-cluster and --initial-cluster-state for members
// starting without data. Members with data ignore both.
// guard is the UID of the cluster's deletion guard, if it has one: members restarting while the
// final backup runs read it.
func MembershipConfigMap(kvc *kvv1.KVCluster, m Membership, guard types.UID) *corev1ac.ConfigMapApplyConfiguration {
	return corev1ac.ConfigMap(MembershipConfigMapName(kvc), kvc.Namespace).
		WithLabels(Labels(kvc)).
		WithOwnerReferences(Owners(kvc, guard)...).
		WithData(map[string]string{
			keyInitialCluster:      m.initialCluster(kvc),
			keyInitialClusterState: m.State,
		})
}

// ParseMembership reads a Membership back from the ConfigMap's data.
func ParseMembership(kvc *kvv1.KVCluster, data map[string]string) (Membership, bool) {
	m := Membership{State: data[keyInitialClusterState]}
	if m.State != ClusterStateNew && m.State != ClusterStateExisting {
		return Membership{}, false
	}
	for _, part := range strings.Split(data[keyInitialCluster], ",") {
		_, url, _ := strings.Cut(part, "=")
		ord, ok := OrdinalOfPeerURL(kvc, url)
		if !ok {
			return Membership{}, false
		}
		m.Ordinals = append(m.Ordinals, ord)
		if url != MemberPeerURL(kvc, ord) {
			if m.PeerURLs == nil {
				m.PeerURLs = map[int]string{}
			}
			m.PeerURLs[ord] = url
		}
	}
	return m, true
}

// InitialCluster is etcd's --initial-cluster value for the members of a new cluster.
func InitialCluster(kvc *kvv1.KVCluster) string {
	return NewClusterMembership(kvc).initialCluster(kvc)
}

func (m Membership) initialCluster(kvc *kvv1.KVCluster) string {
	parts := make([]string, 0, len(m.Ordinals))
	for _, i := range m.Ordinals {
		url, ok := m.PeerURLs[i]
		if !ok {
			url = MemberPeerURL(kvc, i)
		}
		parts = append(parts, MemberName(kvc, i)+"="+url)
	}
	return strings.Join(parts, ",")
}

// MemberPeerURL is the peer URL the member with the given ordinal advertises as the spec wants.
func MemberPeerURL(kvc *kvv1.KVCluster, ordinal int) string {
	return DesiredTransport(kvc).MemberPeerURL(kvc, ordinal)
}

// MemberPeerURL is the peer URL of the member with the given ordinal listening as t.
func (t Transport) MemberPeerURL(kvc *kvv1.KVCluster, ordinal int) string {
	return t.peerURL(memberHost(kvc, MemberName(kvc, ordinal)))
}

// OrdinalOfPeerURL finds which member a peer URL belongs to, in either scheme (a cluster moving
// to TLS has both); etcd knows an added member that has not started yet only by its peer URL.
func OrdinalOfPeerURL(kvc *kvv1.KVCluster, url string) (int, bool) {
	_, rest, _ := strings.Cut(url, "://")
	host, _, _ := strings.Cut(rest, ".")
	if ord, ok := OrdinalOfMember(kvc, host); ok &&
		(url == (Transport{PeerTLS: true}).MemberPeerURL(kvc, ord) || url == (Transport{}).MemberPeerURL(kvc, ord)) {
		return ord, true
	}
	return 0, false
}

// MaxMembers is the API's maximum of spec.partitions: no member of a cluster has an ordinal as high.
const MaxMembers = 9

// OrdinalOfMember is the ordinal of a member name (the pod's name).
func OrdinalOfMember(kvc *kvv1.KVCluster, name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, kvc.Name+"-")
	if !ok {
		return 0, false
	}
	ord, err := strconv.Atoi(digits)
	if err != nil || ord < 0 || ord >= MaxMembers || strconv.Itoa(ord) != digits {
		return 0, false
	}
	return ord, true
}

// membershipEnv maps the Membership ConfigMap into etcd's environment variables.
func membershipEnv(kvc *kvv1.KVCluster) []*corev1ac.EnvVarApplyConfiguration {
	ref := func(name, key string) *corev1ac.EnvVarApplyConfiguration {
		return corev1ac.EnvVar().WithName(name).WithValueFrom(corev1ac.EnvVarSource().
			WithConfigMapKeyRef(corev1ac.ConfigMapKeySelector().WithName(MembershipConfigMapName(kvc)).WithKey(key)))
	}
	return []*corev1ac.EnvVarApplyConfiguration{ref(envInitialCluster, keyInitialCluster), ref(envInitialClusterState, keyInitialClusterState)}
}
