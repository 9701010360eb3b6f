package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
)

const (
	chartDir         = "helm/kvcluster-operator"
	releaseNamespace = "kvcluster-system"
)

// helmLabels are the labels only the chart's objects carry (Helm's release bookkeeping).
var helmLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart"}

func TestChartLints(t *testing.T) {
	helm := backuptest.RequireBinary(t, "KVC_HELM_DIR", "helm")
	for _, set := range [][]string{nil, allMonitoring, {"watchNamespaces={team-a,team-b}"}} {
		args := append([]string{"lint", "--strict", chartDir}, setArgs(set)...)
		if out, err := exec.Command(helm, args...).CombinedOutput(); err != nil {
			t.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

var allMonitoring = []string{"monitoring.serviceMonitor.enabled=true", "monitoring.podMonitor.enabled=true",
	"monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true"}

// TestChartRendersWhatKustomizeDoes: with its default values the chart renders the objects of
// deploy/default, and with monitoring on those of deploy/default with the deploy/monitoring
// component, field for field, so that the two ways to install cannot drift apart. The chart leaves
// out the Namespace (Helm installs into one) and adds Helm's own labels.
func TestChartRendersWhatKustomizeDoes(t *testing.T) {
	helm := backuptest.RequireBinary(t, "KVC_HELM_DIR", "helm")
	kubectl := backuptest.RequireBinary(t, "KVC_KUBECTL_DIR", "kubectl")
	for _, tc := range []struct {
		name       string
		components []string
		set        []string
	}{
		{name: "defaults"},
		{name: "monitoring", components: []string{"monitoring"}, set: allMonitoring},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := objectsByKey(t, kustomize(t, kubectl, tc.components, ""))
			for key, obj := range want {
				if obj["kind"] == "Namespace" {
					delete(want, key)
				}
			}
			got := objectsByKey(t, renderChart(t, helm, setArgs(tc.set)...))
			for _, obj := range got {
				dropHelmLabels(obj)
			}
			for key, w := range want {
				g, ok := got[key]
				if !ok {
					t.Errorf("%s: kustomize renders it, the chart does not", key)
					continue
				}
				if !reflect.DeepEqual(g, w) {
					gy, _ := sigsyaml.Marshal(g)
					wy, _ := sigsyaml.Marshal(w)
					t.Errorf("%s differs\nchart:\n%s\nkustomize:\n%s", key, gy, wy)
				}
			}
			for key := range got {
				if _, ok := want[key]; !ok {
					t.Errorf("%s: the chart renders it, kustomize does not", key)
				}
			}
		})
	}
}

// TestChartValues: what each value changes in the rendered objects, and values that cannot work
// refused with a message that says why.
func TestChartValues(t *testing.T) {
	helm := backuptest.RequireBinary(t, "KVC_HELM_DIR", "helm")
	for _, tc := range []struct {
		name    string
		set     []string
		check   func(t *testing.T, rendered []byte)
		refused string // part of Helm's error when the values are refused
	}{{
		name: "the image is set in one place, for the operator and the Jobs it starts",
		set:  []string{"image.repository=registry.example/platform/kvc", "image.tag=v9.9.9"},
		check: func(t *testing.T, rendered []byte) {
			if bytes.Contains(rendered, []byte("ghcr.io/kvcluster")) {
				t.Error("the default image is still named")
			}
			if _, c := manager(t, rendered); c.Image != "registry.example/platform/kvc:v9.9.9" {
				t.Errorf("image %q", c.Image)
			}
		},
	}, {
		name: "a digest wins over the tag",
		set:  []string{"image.tag=v9.9.9", "image.digest=sha256:" + strings.Repeat("ab", 32)},
		check: func(t *testing.T, rendered []byte) {
			if _, c := manager(t, rendered); c.Image != "ghcr.io/kvcluster/kvcluster-operator@sha256:"+strings.Repeat("ab", 32) {
				t.Errorf("image %q", c.Image)
			}
		},
	}, {
		name: "without leader election: one replica, no Lease role",
		set:  []string{"leaderElection.enabled=false"},
		check: func(t *testing.T, rendered []byte) {
			if _, c := manager(t, rendered); !slices.Contains(c.Args, "--leader-elect=false") {
				t.Errorf("args %q", c.Args)
			}
			if bytes.Contains(rendered, []byte("kvcluster-operator-leader-election")) {
				t.Error("the leader election Role is still rendered")
			}
		},
	}, {
		name:    "two replicas without leader election would both reconcile",
		set:     []string{"replicas=2", "leaderElection.enabled=false"},
		refused: "replicas > 1 needs leaderElection.enabled",
	}, {
		name: "flags and placement",
		set: []string{"logLevel=5", "maxConcurrentReconciles=8", "etcdRepository=mirror.example/etcd",
			"extraArgs={--etcd-timeout=3s}", "nodeSelector.pool=system", "priorityClassName=system-cluster-critical",
			"imagePullSecrets={pull}", "podLabels.team=storage", "podAnnotations.note=x"},
		check: func(t *testing.T, rendered []byte) {
			d, c := manager(t, rendered)
			for _, arg := range []string{"--zap-log-level=5", "--max-concurrent-reconciles=8", "--etcd-repository=mirror.example/etcd", "--etcd-timeout=3s"} {
				if !slices.Contains(c.Args, arg) {
					t.Errorf("args %q lack %s", c.Args, arg)
				}
			}
			pod := d.Spec.Template
			if pod.Spec.NodeSelector["pool"] != "system" || pod.Spec.PriorityClassName != "system-cluster-critical" ||
				len(pod.Spec.ImagePullSecrets) != 1 || pod.Spec.ImagePullSecrets[0].Name != "pull" ||
				pod.Labels["team"] != "storage" || pod.Annotations["note"] != "x" {
				t.Errorf("pod template %+v", pod)
			}
		},
	}, {
		name: "pod labels cannot take the name the clusters' NetworkPolicies admit the operator by",
		set:  []string{"podLabels.app\\.kubernetes\\.io/name=other"},
		check: func(t *testing.T, rendered []byte) {
			if d, _ := manager(t, rendered); d.Spec.Template.Labels["app.kubernetes.io/name"] != "kvcluster-operator" {
				t.Errorf("pod labels %v", d.Spec.Template.Labels)
			}
		},
	}, {
		name: "without metrics: no endpoint, no Service",
		set:  []string{"metrics.enabled=false"},
		check: func(t *testing.T, rendered []byte) {
			if _, c := manager(t, rendered); !slices.Contains(c.Args, "--metrics-bind-address=0") || len(c.Ports) != 1 {
				t.Errorf("args %q, ports %v", c.Args, c.Ports)
			}
			if bytes.Contains(rendered, []byte("kvcluster-operator-metrics")) {
				t.Error("the metrics Service is still rendered")
			}
		},
	}, {
		name:    "a ServiceMonitor needs the metrics endpoint",
		set:     []string{"metrics.enabled=false", "monitoring.serviceMonitor.enabled=true"},
		refused: "monitoring.serviceMonitor needs metrics.enabled",
	}, {
		name: "without admission policies",
		set:  []string{"admissionPolicies.enabled=false"},
		check: func(t *testing.T, rendered []byte) {
			if bytes.Contains(rendered, []byte("AdmissionPolicy")) {
				t.Error("admission policies are still rendered")
			}
		},
	}, {
		name:    "a misspelt value",
		set:     []string{"leaderElection.enable=false"},
		refused: "additional properties 'enable' not allowed",
	}, {
		name:    "an unknown log level",
		set:     []string{"logLevel=loud"},
		refused: "at '/logLevel': 'loud' does not match pattern",
	}, {
		name:    "a verbosity the operator's flag refuses",
		set:     []string{"logLevel=0"},
		refused: "at '/logLevel'",
	}, {
		name:    "a flag without its dashes",
		set:     []string{"extraArgs={etcd-timeout=3s}"},
		refused: "at '/extraArgs/0': 'etcd-timeout=3s' does not match pattern",
	}, {
		name: "watching some namespaces: a Role in each, cluster-wide only KVClusters, namespaces and reviews",
		set:  []string{"watchNamespaces={team-a,team-b}", "monitoring.podMonitor.enabled=true"},
		check: func(t *testing.T, rendered []byte) {
			role, err := OperatorRole()
			if err != nil {
				t.Fatal(err)
			}
			wantCluster, wantNamespaced := NamespacedRules(role.Rules)
			objects := objectsByKey(t, rendered)
			var clusterRole rbacv1.ClusterRole
			typed(t, objects["ClusterRole <nil>/kvcluster-operator"], &clusterRole)
			if !reflect.DeepEqual(clusterRole.Rules, wantCluster) {
				t.Errorf("ClusterRole rules %+v, want %+v", clusterRole.Rules, wantCluster)
			}
			operator := rbacv1.Subject{Kind: "ServiceAccount", Name: "kvcluster-operator", Namespace: releaseNamespace}
			for _, ns := range []string{"team-a", "team-b"} {
				var role rbacv1.Role
				var binding rbacv1.RoleBinding
				typed(t, objects["Role "+ns+"/kvcluster-operator"], &role)
				typed(t, objects["RoleBinding "+ns+"/kvcluster-operator"], &binding)
				if !reflect.DeepEqual(role.Rules, wantNamespaced) {
					t.Errorf("namespace %s: Role rules %+v, want %+v", ns, role.Rules, wantNamespaced)
				}
				if binding.RoleRef.Name != "kvcluster-operator" || !slices.Equal(binding.Subjects, []rbacv1.Subject{operator}) {
					t.Errorf("namespace %s: RoleBinding %+v", ns, binding)
				}
			}
			if _, ok := objects["Role "+releaseNamespace+"/kvcluster-operator"]; ok {
				t.Error("the operator's own namespace, not watched, has its Role")
			}
			var ownPod rbacv1.Role
			typed(t, objects["Role "+releaseNamespace+"/kvcluster-operator-own-pod"], &ownPod)
			if !reflect.DeepEqual(ownPod.Rules, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}}) {
				t.Errorf("the operator may not read its own pod: %+v", ownPod.Rules)
			}
			if _, c := manager(t, rendered); !slices.Contains(c.Args, "--watch-namespaces=team-a,team-b") {
				t.Errorf("args %q", c.Args)
			}
			spec, _ := objects["PodMonitor "+releaseNamespace+"/kvcluster-members"]["spec"].(map[string]any)
			if got := fmt.Sprint(spec["namespaceSelector"]); got != "map[matchNames:[team-a team-b]]" {
				t.Errorf("the PodMonitor selects namespaces %s", got)
			}
		},
	}, {
		name:    "a namespace's name",
		set:     []string{"watchNamespaces={Team-A}"},
		refused: "at '/watchNamespaces/0': 'Team-A' does not match pattern",
	}, {
		name:    "a namespace named twice",
		set:     []string{"watchNamespaces={team-a,team-a}"},
		refused: "at '/watchNamespaces'",
	}, {
		name: "labels for a Prometheus's selectors",
		set:  []string{"monitoring.podMonitor.enabled=true", "monitoring.labels.release=kps"},
		check: func(t *testing.T, rendered []byte) {
			podMonitor := objectsByKey(t, rendered)["PodMonitor "+releaseNamespace+"/kvcluster-members"]
			labels, _ := podMonitor["metadata"].(map[string]any)["labels"].(map[string]any)
			if labels["release"] != "kps" {
				t.Errorf("PodMonitor labels %v", labels)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rendered, err := helmTemplate(helm, setArgs(tc.set)...)
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("want refused with %q, got %v", tc.refused, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, rendered)
		})
	}
}

func setArgs(set []string) []string {
	var args []string
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

// helmTemplate renders the chart as `helm install -n kvcluster-system` would, CRDs included, with
// more arguments (values).
func helmTemplate(helm string, values ...string) ([]byte, error) {
	args := append([]string{"template", "kvcluster-operator", chartDir, "--namespace", releaseNamespace, "--include-crds"}, values...)
	var stderr strings.Builder
	cmd := exec.Command(helm, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

func renderChart(t *testing.T, helm string, values ...string) []byte {
	t.Helper()
	out, err := helmTemplate(helm, values...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// objectsByKey decodes YAML documents into objects keyed by kind, namespace and name.
func objectsByKey(t *testing.T, manifests []byte) map[string]map[string]any {
	t.Helper()
	objects := map[string]map[string]any{}
	reader := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifests)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objects
		} else if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := sigsyaml.Unmarshal(doc, &obj); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if obj == nil {
			continue // an empty document
		}
		meta, _ := obj["metadata"].(map[string]any)
		key := fmt.Sprintf("%s %v/%v", obj["kind"], meta["namespace"], meta["name"])
		if _, dup := objects[key]; dup {
			t.Errorf("%s is rendered twice", key)
		}
		objects[key] = obj
	}
}

func dropHelmLabels(obj map[string]any) {
	meta, _ := obj["metadata"].(map[string]any)
	labels, _ := meta["labels"].(map[string]any)
	for _, l := range helmLabels {
		delete(labels, l)
	}
	if labels != nil && len(labels) == 0 {
		delete(meta, "labels")
	}
}

// typed decodes one of objectsByKey's objects into its Go type.
func typed(t *testing.T, obj map[string]any, into any) {
	t.Helper()
	if obj == nil {
		t.Fatalf("%T: not rendered", into)
	}
	data, err := sigsyaml.Marshal(obj)
	if err == nil {
		err = sigsyaml.UnmarshalStrict(data, into)
	}
	if err != nil {
		t.Fatalf("%T: %v", into, err)
	}
}

func manager(t *testing.T, rendered []byte) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	d, c, err := Manager(rendered)
	if err != nil {
		t.Fatal(err)
	}
	return d, c
}
