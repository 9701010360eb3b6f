package monitoring

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
)

// promtool checks prometheusrule.yaml's spec as a rule file and runs the alert unit tests of
// rules_test.yaml on it.
func TestAlertRules(t *testing.T) {
	promtool := backuptest.RequireBinary(t, "KVC_PROMETHEUS", "promtool")
	dir := t.TempDir()
	rules, err := RuleFile()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
