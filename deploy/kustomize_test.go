package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
)

// TestOperatorImageIsSetInOnePlace: an overlay of deploy/default that sets the operator's image
// the way `kustomize edit set image` does leaves no reference to the image it replaced, so backup
// and restore Jobs cannot keep running the old one: the operator gives them its own container's
// image (the container named "manager"), read from its pod at start.
func TestOperatorImageIsSetInOnePlace(t *testing.T) {
	kubectl := backuptest.RequireBinary(t, "KVC_KUBECTL_DIR", "kubectl")
	base, err := filepath.Abs("default")
	if err != nil {
		t.Fatal(err)
	}
	overlay := t.TempDir()
	base, err = filepath.Rel(overlay, base) // kustomize takes no absolute path
	if err != nil {
		t.Fatal(err)
	}
	kustomization := "resources:\n  - " + base + "\nimages:\n  - name: ghcr.io/kvcluster/kvcluster-operator\n    newName: registry.example/platform/kvc\n    newTag: v9.9.9\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kustomization), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kubectl, "kustomize", overlay).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "ghcr.io/kvcluster/kvcluster-operator") {
			t.Errorf("the replaced image is still named: %s", strings.TrimSpace(line))
		}
	}
	var manager []string
	decoder := yaml.NewYAMLOrJSONDecoder(strings.NewReader(string(out)), 4096)
	for {
		var dep appsv1.Deployment
		if err := decoder.Decode(&dep); err != nil {
			break
		}
		if dep.Kind != "Deployment" {
			continue
		}
		for _, c := range dep.Spec.Template.Spec.Containers {
			if c.Name == "manager" {
				manager = append(manager, c.Image)
			}
		}
	}
	if len(manager) != 1 || manager[0] != "registry.example/platform/kvc:v9.9.9" {
		t.Errorf("images of the containers named manager: %q, want the overlay's, once", manager)
	}
}
