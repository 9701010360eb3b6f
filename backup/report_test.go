package backup

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestReportFitsTheTerminationMessage: whatever a backup did, its report fits what the kubelet
// keeps of a termination message and still says where the backup went and how many objects it
// pruned and removed; a report that fits is the whole result.
func TestReportFitsTheTerminationMessage(t *testing.T) {
	names := func(n int, what string) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("team-a/prod/ledger/4a1b0c7e-1d2f-4e5a-9b8c-7d6e5f4a3b2c/%s-%d.db", what, i))
		}
		return out
	}
	base := Result{Location: "s3://backups/team-a/prod/ledger/4a1b0c7e/ledger-29936105.db", Size: 389152, SHA256: strings.Repeat("ab", 32), Revision: 3271}
	tests := []struct {
		name             string
		pruned, removed  int
		warnings         []string
		wantWhole        bool
		wantSomeWarnings bool
	}{
		{name: "a short report is the whole result", pruned: 3, warnings: []string{"could not remove x"}, wantWhole: true, wantSomeWarnings: true},
		{name: "many pruned", pruned: 200},
		{name: "many pruned and removed", pruned: 100, removed: 100},
		{name: "long warnings", warnings: []string{strings.Repeat("w", 3000), strings.Repeat("v", 3000), "short"}, wantSomeWarnings: true},
		{name: "a long warning is not cut in the middle of a character", pruned: 60, warnings: []string{"x" + strings.Repeat("é", 3000)}, wantSomeWarnings: true},
		{name: "many warnings", pruned: 40, warnings: strings.Split(strings.Repeat("a warning of some length to fill the report up;", 100), ";"), wantSomeWarnings: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := base
			r.Pruned, r.RemovedPartial, r.Warnings = names(tt.pruned, "ledger"), names(tt.removed, "partial"), tt.warnings
			report := r.Report()
			var got Result
			if err := json.Unmarshal(report, &got); err != nil || len(report) > MaxReportBytes {
				t.Fatalf("report of %d bytes (at most %d kept), parsed: %v", len(report), MaxReportBytes, err)
			}
			if got.Location != r.Location || got.Size != r.Size || got.SHA256 != r.SHA256 || got.Revision != r.Revision {
				t.Errorf("report %+v lost where the backup went", got)
			}
			if n := max(got.PrunedCount, len(got.Pruned)); n != tt.pruned {
				t.Errorf("report says %d pruned, want %d", n, tt.pruned)
			}
			if n := max(got.RemovedPartialCount, len(got.RemovedPartial)); n != tt.removed {
				t.Errorf("report says %d removed, want %d", n, tt.removed)
			}
			if whole, _ := json.Marshal(r); tt.wantWhole != (string(whole) == string(report)) {
				t.Errorf("the report is the whole result: %t, want %t", !tt.wantWhole, tt.wantWhole)
			}
			if (len(got.Warnings) > 0) != tt.wantSomeWarnings || strings.Contains(strings.Join(got.Warnings, ""), "\uFFFD") {
				t.Errorf("warnings %q", got.Warnings)
			}
		})
	}
}
