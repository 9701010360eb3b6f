package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The simulated members exist for the fleet benchmark only: the operator built without the kvcsim
// tag, as the Dockerfile builds it, must not contain them.
func TestTheOperatorCarriesNoSimulatedMembers(t *testing.T) {
	const sim = "github.com/kvcluster/kvcluster-operator/controllers/members/membersim"
	for _, tt := range []struct {
		tags string
		want bool
	}{{"", false}, {"kvcsim", true}} {
		out, err := exec.Command("go", "list", "-tags", tt.tags, "-deps", ".").CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		if got := strings.Contains(string(out), sim+"\n"); got != tt.want {
			t.Errorf("built with tags %q: depends on membersim = %v, want %v", tt.tags, got, tt.want)
		}
	}
}
