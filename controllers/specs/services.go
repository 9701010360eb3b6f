package specs

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// PeerService is the headless Service behind the members' stable DNS names. It publishes
// not-ready addresses because members must find each other before any of them is ready: readiness
// needs a quorum, and a quorum needs the peers to resolve. guard is the UID of the cluster's
// deletion guard, if it has one: the final backup reaches the members by these names.
func PeerService(kvc *kvv1.KVCluster, guard types.UID) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(PeerServiceName(kvc), kvc.Namespace).
		WithLabels(Labels(kvc)).
		WithOwnerReferences(Owners(kvc, guard)...).
		WithSpec(corev1ac.ServiceSpec().
			WithClusterIP(corev1.ClusterIPNone).
			WithPublishNotReadyAddresses(true).
			WithSelector(SelectorLabels(kvc)).
			WithPorts(
				servicePort("client", ClientPort),
				servicePort("peer", PeerPort),
			))
}

// drainedLabel is in the selector of a drained client Service, and on no pod.
const drainedLabel = "kvcluster.io/drained"

// DrainedAtAnnotation on a drained client Service says when it stopped taking connections.
const DrainedAtAnnotation = "kvcluster.io/drained-at"

// ClientService load-balances clients over the ready members. Drained (drainedAt is not zero: on
// deletion, before the final backup), it selects no pod, so it takes no new connection.
func ClientService(kvc *kvv1.KVCluster, drainedAt time.Time) *corev1ac.ServiceApplyConfiguration {
	selector := SelectorLabels(kvc)
	svc := corev1ac.Service(ClientServiceName(kvc), kvc.Namespace)
	if !drainedAt.IsZero() {
		selector[drainedLabel] = "true"
		svc.WithAnnotations(map[string]string{DrainedAtAnnotation: drainedAt.UTC().Format(time.RFC3339)})
	}
	return svc.
		WithLabels(Labels(kvc)).
		WithOwnerReferences(OwnerReference(kvc)).
		WithSpec(corev1ac.ServiceSpec().
			WithType(corev1.ServiceTypeClusterIP).
			WithSelector(selector).
			WithPorts(servicePort("client", ClientPort)))
}

func servicePort(name string, port int32) *corev1ac.ServicePortApplyConfiguration {
	return corev1ac.ServicePort().
		WithName(name).
		WithProtocol(corev1.ProtocolTCP).
		WithPort(port).
		WithTargetPort(intstr.FromString(name))
}
