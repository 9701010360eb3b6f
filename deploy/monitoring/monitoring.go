// Package monitoring holds the shipped alert rules (prometheusrule.yaml) and dashboard
// (dashboard.json), for the tests that run them: promtool's unit tests here, the metric names
// the operator exports (controllers), and a real Prometheus on a real cluster in e2e.
package monitoring

import (
	_ "embed"
	"encoding/json"
	"fmt"

	"sigs.k8s.io/yaml"
)

// PrometheusRule is prometheusrule.yaml, the PrometheusRule the kustomize component ships.
//
//go:embed prometheusrule.yaml
var PrometheusRule []byte

// Dashboard is dashboard.json, the Grafana dashboard the kustomize component ships.
//
//go:embed dashboard.json
var Dashboard []byte

// DashboardQueries are the PromQL expressions of the dashboard's panels, by panel title.
func DashboardQueries() (map[string][]string, error) {
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(Dashboard, &d); err != nil {
		return nil, fmt.Errorf("dashboard.json: %w", err)
	}
	out := map[string][]string{}
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			out[p.Title] = append(out[p.Title], t.Expr)
		}
	}
	return out, nil
}

// RuleFile is the rule file the PrometheusRule holds (its spec), as Prometheus loads it.
func RuleFile() ([]byte, error) {
	var obj struct {
		Kind string          `json:"kind"`
		Spec json.RawMessage `json:"spec"`
	}
	if err := yaml.Unmarshal(PrometheusRule, &obj); err != nil {
		return nil, err
	}
	if obj.Kind != "PrometheusRule" || len(obj.Spec) == 0 {
		return nil, fmt.Errorf("prometheusrule.yaml is a %q with no spec, not a PrometheusRule", obj.Kind)
	}
	return yaml.JSONToYAML(obj.Spec)
}
