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
	out := kustomize(t, kubectl, nil, "images:\n  - name: ghcr.io/kvcluster/kvcluster-operator\n    newName: registry.example/platform/kvc\n    newTag: v9.9.9\n")
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

// kustomize renders an overlay of deploy/default with the given components of deploy/ and more
// lines of kustomization (extra).
func kustomize(t *testing.T, kubectl string, components []string, extra string) []byte {
	t.Helper()
	overlay := t.TempDir()
	kustomization := "resources:\n  - " + relativeTo(t, overlay, "default") + "\n"
	if len(components) > 0 {
		kustomization += "components:\n"
		for _, c := range components {
			kustomization += "  - " + relativeTo(t, overlay, c) + "\n"
		}
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kustomization+extra), 0o600); err != nil {
		t.Fatal(err)
	}
	return kustomizeRun(t, kubectl, overlay)
}

// kustomizeRun renders a kustomize folder.
func kustomizeRun(t *testing.T, kubectl, dir string) []byte {
	t.Helper()
	var stderr strings.Builder
	cmd := exec.Command(kubectl, "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
	}
	return out
}

// relativeTo is deploy/<dir> relative to from (kustomize takes no absolute path).
func relativeTo(t *testing.T, from, dir string) string {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(from, abs)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}
