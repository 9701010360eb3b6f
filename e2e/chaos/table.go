package chaos

import (
	"fmt"
	"strings"
)

// Row is one scenario's line of the table `make chaos` ends with.
type Row struct {
	Scenario   string
	Runs       int
	Faults     int
	Violations int
}

// Table lays the rows out with a total line, as a user reads it at the end of a run.
func Table(rows []Row) string {
	var b strings.Builder
	width := len("scenario")
	for _, r := range rows {
		width = max(width, len(r.Scenario))
	}
	line := func(name string, runs, faults, violations any) {
		fmt.Fprintf(&b, "%-*s  %6v  %6v  %10v\n", width, name, runs, faults, violations)
	}
	line("scenario", "runs", "faults", "violations")
	var total Row
	for _, r := range rows {
		line(r.Scenario, r.Runs, r.Faults, r.Violations)
		total.Faults += r.Faults
		total.Violations += r.Violations
	}
	line("total", "", total.Faults, total.Violations)
	return b.String()
}
