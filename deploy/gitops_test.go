package deploy

import (
	"context"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
)

// repoURL is where the GitOps examples fetch this repository from.
const repoURL = "https://github.com/kvcluster/kvcluster-operator.git"

// TestGitOpsExamples: the Argo CD Application and the Flux objects of deploy/gitops are valid for
// their tools' own CRDs (Argo CD's and Flux's, applied to a real API server, which checks every
// field, unknown ones included), and what they point at in this repository renders: the chart with
// the Application's values, and the kustomize folders, whose KVClusters the API server accepts.
func TestGitOpsExamples(t *testing.T) {
	crds := backuptest.RequireBinary(t, "KVC_GITOPS_CRDS", "application-crd.yaml")
	backuptest.RequireBinary(t, "KUBEBUILDER_ASSETS", "kube-apiserver")
	helm := backuptest.RequireBinary(t, "KVC_HELM_DIR", "helm")
	kubectl := backuptest.RequireBinary(t, "KVC_KUBECTL_DIR", "kubectl")

	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Dir(crds), "crd"}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop() // Start leaves what it started running when installing the CRDs fails
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ns := range []string{"argocd", "flux-system"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	// admitted creates obj as a dry run, refusing unknown fields as kubectl apply does.
	admitted := func(t *testing.T, obj *unstructured.Unstructured) {
		t.Helper()
		if err := c.Create(ctx, obj, client.DryRunAll, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Errorf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	// renderedClusters renders a kustomize folder of this repository and checks its objects.
	renderedClusters := func(t *testing.T, repoPath string) []*unstructured.Unstructured {
		t.Helper()
		objs := decodeAll(t, kustomizeDir(t, kubectl, repoPath))
		var clusters []*unstructured.Unstructured
		for _, obj := range objs { // namespaces first, made for real: the dry runs go into them
			if obj.GetKind() == "Namespace" {
				if err := c.Create(ctx, obj.DeepCopy()); client.IgnoreAlreadyExists(err) != nil {
					t.Fatal(err)
				}
			}
		}
		for _, obj := range objs {
			if obj.GetKind() != "Namespace" {
				admitted(t, obj)
			}
			if obj.GetKind() == "KVCluster" {
				clusters = append(clusters, obj)
			}
		}
		if len(clusters) == 0 {
			t.Errorf("%s holds no KVCluster", repoPath)
		}
		return clusters
	}

	t.Run("Argo CD", func(t *testing.T) {
		apps := decodeAll(t, readFile(t, "gitops/argocd/kvcluster.yaml"))
		if len(apps) != 1 || apps[0].GetKind() != "Application" {
			t.Fatalf("want one Application, got %d objects", len(apps))
		}
		app := apps[0]
		admitted(t, app)
		sources, _, _ := unstructured.NestedSlice(app.Object, "spec", "sources")
		var chart, clusters bool
		for _, s := range sources {
			source := s.(map[string]any)
			if source["repoURL"] != repoURL {
				t.Errorf("source %v: repoURL is not %s", source, repoURL)
			}
			switch p := source["path"].(string); p {
			case "deploy/helm/kvcluster-operator":
				chart = true
				values, _, _ := unstructured.NestedMap(source, "helm", "valuesObject")
				rendered := renderChartWithValues(t, helm, values)
				if _, c := manager(t, rendered); c.Image != "ghcr.io/kvcluster/kvcluster-operator:dev" {
					t.Errorf("the Application's values give image %q", c.Image)
				}
			case "deploy/gitops/clusters":
				clusters = true
				for _, kvc := range renderedClusters(t, p) {
					if wave := kvc.GetAnnotations()["argocd.argoproj.io/sync-wave"]; wave != "1" {
						t.Errorf("KVCluster %s is in sync wave %q, want 1: after the operator's (0)", kvc.GetName(), wave)
					}
				}
			default:
				t.Errorf("source path %q is not one the test knows", p)
			}
		}
		if !chart || !clusters {
			t.Errorf("the Application syncs the chart: %v, the clusters: %v", chart, clusters)
		}
	})

	t.Run("Flux", func(t *testing.T) {
		objs := decodeAll(t, readFile(t, "gitops/flux/kvcluster.yaml"))
		kustomizations := map[string]*unstructured.Unstructured{}
		for _, obj := range objs {
			admitted(t, obj)
			switch obj.GetKind() {
			case "GitRepository":
				if url, _, _ := unstructured.NestedString(obj.Object, "spec", "url"); url != repoURL {
					t.Errorf("GitRepository url %q, want %s", url, repoURL)
				}
			case "Kustomization":
				kustomizations[obj.GetName()] = obj
			}
		}
		operator, clusters := kustomizations["kvcluster-operator"], kustomizations["kvclusters"]
		if operator == nil || clusters == nil {
			t.Fatalf("want the Kustomizations kvcluster-operator and kvclusters, got %d", len(kustomizations))
		}
		if p, _, _ := unstructured.NestedString(operator.Object, "spec", "path"); path.Clean(p) != "deploy/default" {
			t.Errorf("the operator's Kustomization syncs %q", p)
		}
		dependsOn, _, _ := unstructured.NestedSlice(clusters.Object, "spec", "dependsOn")
		if len(dependsOn) != 1 || dependsOn[0].(map[string]any)["name"] != "kvcluster-operator" {
			t.Errorf("the clusters' Kustomization depends on %v, want the operator's", dependsOn)
		}
		p, _, _ := unstructured.NestedString(clusters.Object, "spec", "path")
		renderedClusters(t, path.Clean(p))
	})

	t.Run("the CRD is never deleted by a GitOps tool", func(t *testing.T) {
		crd := decodeAll(t, readFile(t, "crd/kvcluster.io_kvclusters.yaml"))[0]
		for key, want := range map[string]string{"argocd.argoproj.io/sync-options": "Delete=false", "kustomize.toolkit.fluxcd.io/prune": "disabled"} {
			if got := crd.GetAnnotations()[key]; got != want {
				t.Errorf("CRD annotation %s = %q, want %q", key, got, want)
			}
		}
	})
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func decodeAll(t *testing.T, manifests []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, obj := range objectsByKey(t, manifests) {
		objs = append(objs, &unstructured.Unstructured{Object: obj})
	}
	return objs
}

// kustomizeDir renders a kustomize folder given by its path in this repository.
func kustomizeDir(t *testing.T, kubectl, repoPath string) []byte {
	t.Helper()
	dir, ok := strings.CutPrefix(repoPath, "deploy/")
	if !ok {
		t.Fatalf("%s is not under deploy/", repoPath)
	}
	return kustomizeRun(t, kubectl, dir)
}

// renderChartWithValues renders the chart with a values file holding values.
func renderChartWithValues(t *testing.T, helm string, values map[string]any) []byte {
	t.Helper()
	data, err := sigsyaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return renderChart(t, helm, "--values", file)
}
