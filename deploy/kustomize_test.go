package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
)

// TestOperatorImageIsSetInOnePlace: an overlay of deploy/default that sets the operator's image
// the way `kustomize edit set image` does leaves no reference to the image it replaced, so backup
// and restore Jobs cannot keep running the old one: the operator gives them its own container's
// image (ManagerContainer's), read from its pod at start.
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
	var stderr strings.Builder
	render := exec.Command(kubectl, "kustomize", overlay)
	render.Stderr = &stderr
	out, err := render.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, stderr.String())
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "ghcr.io/kvcluster/kvcluster-operator") {
			t.Errorf("the replaced image is still named: %s", strings.TrimSpace(line))
		}
	}
	_, manager, err := Manager(out)
	if err != nil {
		t.Fatal(err)
	}
	if manager.Image != "registry.example/platform/kvc:v9.9.9" {
		t.Errorf("the manager container's image is %q, want the overlay's", manager.Image)
	}
}
