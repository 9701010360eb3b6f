package deploy

import (
	_ "embed"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

//go:embed rbac/role.yaml
var roleManifest []byte

// OperatorRole is the operator's ClusterRole, as `make generate` writes it from the controllers'
// RBAC markers (rbac/role.yaml): everything the operator does, in every namespace.
func OperatorRole() (*rbacv1.ClusterRole, error) {
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(roleManifest, &role); err != nil {
		return nil, fmt.Errorf("deploy/rbac/role.yaml: %w", err)
	}
	return &role, nil
}

// clusterWide are the resources an install that watches only some namespaces still needs in
// every namespace: those that are not namespaced (the metrics endpoint's reviews; the operator's
// own, at start, of whether it may work in a watched namespace; a namespace,
// read to know whether it is being deleted; a claim's StorageClass, read to know whether it can
// grow; the PriorityClass spec.pods names, read to know whether a member's pod can be created),
// and the KVClusters themselves. A deleted namespace
// takes its Roles with it while its KVClusters still hold the operator's finalizer: only a
// cluster-wide grant lets the operator see that the namespace is going and let its clusters go.
// The cache still watches the watched namespaces only.
var clusterWide = map[string]bool{
	"/namespaces":                                   true,
	"authentication.k8s.io/tokenreviews":            true,
	"authorization.k8s.io/subjectaccessreviews":     true,
	"authorization.k8s.io/selfsubjectaccessreviews": true,
	"storage.k8s.io/storageclasses":                 true,
	"scheduling.k8s.io/priorityclasses":             true,
	"kvcluster.io/kvclusters":                       true,
	"kvcluster.io/kvclusters/status":                true,
	"kvcluster.io/kvclusters/finalizers":            true,
}

// NamespacedRules splits the operator's rules for an install that watches some namespaces
// (--watch-namespaces): what a ClusterRole grants everywhere (clusterWide) and what a Role grants
// in each watched namespace: the members' workloads, their Secrets, Jobs and the rest. Each rule
// returned names one API group; non-resource URLs are cluster-wide. The chart renders the same
// split (TestChartValues).
func NamespacedRules(rules []rbacv1.PolicyRule) (cluster, namespaced []rbacv1.PolicyRule) {
	for _, rule := range rules {
		if len(rule.NonResourceURLs) > 0 {
			cluster = append(cluster, rbacv1.PolicyRule{NonResourceURLs: rule.NonResourceURLs, Verbs: rule.Verbs})
		}
		for _, group := range rule.APIGroups {
			var c, n []string
			for _, resource := range rule.Resources {
				if clusterWide[group+"/"+resource] {
					c = append(c, resource)
				} else {
					n = append(n, resource)
				}
			}
			if len(c) > 0 {
				cluster = append(cluster, rbacv1.PolicyRule{APIGroups: []string{group}, Resources: c, ResourceNames: rule.ResourceNames, Verbs: rule.Verbs})
			}
			if len(n) > 0 {
				namespaced = append(namespaced, rbacv1.PolicyRule{APIGroups: []string{group}, Resources: n, ResourceNames: rule.ResourceNames, Verbs: rule.Verbs})
			}
		}
	}
	return cluster, namespaced
}
