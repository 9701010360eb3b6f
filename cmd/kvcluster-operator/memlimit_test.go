package main

import (
	"testing"

	"github.com/kvcluster/kvcluster-operator/deploy"
)

func TestGoMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name                       string
		goMemLimit, containerLimit string
		want                       int64
		wantSet, wantErr           bool
	}{
		{name: "no container limit", want: 0},
		{name: "256Mi container", containerLimit: "268435456", want: 241591905, wantSet: true},
		{name: "GOMEMLIMIT wins", goMemLimit: "100MiB", containerLimit: "268435456"},
		{name: "a quantity", containerLimit: "256Mi", want: 241591905, wantSet: true},
		{name: "not a size", containerLimit: "a lot", wantErr: true},
		{name: "zero", containerLimit: "0", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, set, err := goMemoryLimit(tc.goMemLimit, tc.containerLimit)
			if (err != nil) != tc.wantErr || set != tc.wantSet || got != tc.want {
				t.Errorf("goMemoryLimit(%q, %q) = %d, %v, %v; want %d, %v, error %v", tc.goMemLimit, tc.containerLimit, got, set, err, tc.want, tc.wantSet, tc.wantErr)
			}
		})
	}
}

// TestDeploymentGivesItsMemoryLimit: the shipped Deployment passes the manager container's own
// memory limit, so the Go limit follows when someone changes the container's.
func TestDeploymentGivesItsMemoryLimit(t *testing.T) {
	_, c, err := deploy.Manager(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range c.Env {
		if e.Name != "MEMORY_LIMIT" {
			continue
		}
		if r := e.ValueFrom; r == nil || r.ResourceFieldRef == nil || r.ResourceFieldRef.Resource != "limits.memory" ||
			r.ResourceFieldRef.ContainerName != c.Name || !r.ResourceFieldRef.Divisor.IsZero() {
			t.Fatalf("MEMORY_LIMIT of container %s is %+v, want its own limits.memory in bytes", c.Name, e.ValueFrom)
		}
		if _, ok := c.Resources.Limits["memory"]; !ok {
			t.Fatalf("container %s has no memory limit to pass", c.Name)
		}
		return
	}
	t.Fatal("the manager container gets no MEMORY_LIMIT")
}
