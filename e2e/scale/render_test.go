package main

import (
	"strings"
	"testing"
	"time"
)

// After a failed creation only the creation row is printed: the scenarios that did not run get
// no row of zeros or NaN passing for a measurement.
func TestOnlyTheScenariosThatRanArePrinted(t *testing.T) {
	failed := &result{n: 1000, create: scenario{window: 7 * time.Minute, took: 7 * time.Minute, notDone: 400}}
	ran := &result{n: 10,
		create:  scenario{window: time.Minute, took: 5 * time.Second},
		steady:  scenario{window: time.Minute, etcdConns: 30, etcdRequests: 40},
		frozen:  scenario{window: time.Minute, frozen: 1, clusters: 1},
		upgrade: scenario{window: time.Minute, clusters: 11},
		delete:  scenario{window: time.Minute, clusters: 11},
	}
	out := render([]*result{ran, failed}, time.Minute, 0.1, 0)
	if strings.Contains(out, "NaN") {
		t.Errorf("the tables hold NaN:\n%s", out)
	}
	rows := map[string]int{}
	for line := range strings.SplitSeq(out, "\n") {
		for _, n := range []string{"10", "11", "1000"} {
			if strings.HasPrefix(line, "| "+n+" |") {
				rows[n]++
			}
		}
	}
	// N=10: creation, idle, frozen; its 11 clusters: upgrade, deletion; N=1000: creation only.
	if rows["10"] != 3 || rows["11"] != 2 || rows["1000"] != 1 {
		t.Errorf("rows per fleet: %v, want 10: 3, 11: 2, 1000: 1\n%s", rows, out)
	}
	if !strings.Contains(out, "**N=1000: 400 clusters never became Ready**") {
		t.Errorf("the clusters that never became Ready are not said:\n%s", out)
	}
}
