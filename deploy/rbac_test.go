package deploy

import (
	"maps"
	"reflect"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
)

// grants are the (group, resource, verb) triples rules grant.
func grants(rules []rbacv1.PolicyRule) map[[3]string]bool {
	out := map[[3]string]bool{}
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out[[3]string{g, res, v}] = true
				}
			}
		}
	}
	return out
}

// TestNamespacedRulesGrantWhatTheClusterRoleDoes: a namespaced install grants, between its
// ClusterRole and the Role of a watched namespace, exactly what the cluster-wide install grants,
// and cluster-wide nothing but its own kind, namespaces and the metrics endpoint's reviews: none
// of the members' workloads, Secrets or Jobs.
func TestNamespacedRulesGrantWhatTheClusterRoleDoes(t *testing.T) {
	role, err := OperatorRole()
	if err != nil {
		t.Fatal(err)
	}
	cluster, namespaced := NamespacedRules(role.Rules)
	all, c, n := grants(role.Rules), grants(cluster), grants(namespaced)
	union := maps.Clone(c)
	maps.Copy(union, n)
	if !maps.Equal(union, all) {
		for g := range all {
			if !union[g] {
				t.Errorf("the split does not grant %v", g)
			}
		}
		for g := range union {
			if !all[g] {
				t.Errorf("the split grants %v, which the ClusterRole does not", g)
			}
		}
	}
	for g := range c {
		if n[g] {
			t.Errorf("%v is granted both cluster-wide and per namespace", g)
		}
	}
	for _, want := range [][3]string{
		{"kvcluster.io", "kvclusters/finalizers", "update"}, {"kvcluster.io", "kvclusters", "patch"},
		{"", "namespaces", "get"}, {"apps", "statefulsets", "patch"}, {"", "secrets", "get"}, {"batch", "jobs", "create"},
	} {
		if !all[want] {
			t.Errorf("the operator's ClusterRole no longer grants %v: update this test", want)
		}
	}
	for _, g := range [][3]string{{"apps", "statefulsets", "patch"}, {"", "secrets", "get"}, {"batch", "jobs", "create"}, {"", "pods", "delete"}} {
		if c[g] || !n[g] {
			t.Errorf("%v: want it granted per watched namespace only", g)
		}
	}
	for _, r := range append(slices.Clone(cluster), namespaced...) {
		if len(r.APIGroups) != 1 {
			t.Errorf("rule %+v names %d groups, want one", r, len(r.APIGroups))
		}
	}
}

// TestNamespacedRulesKeepWhatNarrowsARule: a rule limited to some objects stays so limited, and
// non-resource URLs (never namespaced) stay cluster-wide.
func TestNamespacedRulesKeepWhatNarrowsARule(t *testing.T) {
	cluster, namespaced := NamespacedRules([]rbacv1.PolicyRule{
		{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
		{APIGroups: []string{"kvcluster.io"}, Resources: []string{"kvclusters"}, ResourceNames: []string{"one"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"one"}, Verbs: []string{"get"}},
	})
	wantCluster := []rbacv1.PolicyRule{
		{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
		{APIGroups: []string{"kvcluster.io"}, Resources: []string{"kvclusters"}, ResourceNames: []string{"one"}, Verbs: []string{"get"}},
	}
	wantNamespaced := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"one"}, Verbs: []string{"get"}},
	}
	if !reflect.DeepEqual(cluster, wantCluster) || !reflect.DeepEqual(namespaced, wantNamespaced) {
		t.Errorf("split into\n%#v\n%#v\nwant\n%#v\n%#v", cluster, namespaced, wantCluster, wantNamespaced)
	}
}
