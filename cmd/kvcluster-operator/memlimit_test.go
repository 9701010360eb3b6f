package main

import (
	"errors"
	"os"
	"testing"

	"github.com/kvcluster/kvcluster-operator/deploy"
)

func TestGoMemoryLimit(t *testing.T) {
	const executable = 49 << 20
	sized := func() (int64, error) { return executable, nil }
	for _, tc := range []struct {
		name                       string
		goMemLimit, containerLimit string
		executable                 func() (int64, error)
		want                       int64
		wantSet, wantErr           bool
	}{
		{name: "no container limit", want: 0},
		{name: "256Mi container", containerLimit: "268435456", want: (256 - 49) << 20 / 10 * 9, wantSet: true},
		{name: "GOMEMLIMIT wins", goMemLimit: "100MiB", containerLimit: "268435456"},
		{name: "a quantity", containerLimit: "256Mi", want: (256 - 49) << 20 / 10 * 9, wantSet: true},
		{name: "not a size", containerLimit: "a lot", wantErr: true},
		{name: "zero", containerLimit: "0", wantErr: true},
		{name: "no more than the executable", containerLimit: "49Mi", wantErr: true},
		{name: "the executable unknown", containerLimit: "256Mi", wantErr: true,
			executable: func() (int64, error) { return 0, errors.New("no /proc") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.executable == nil {
				tc.executable = sized
			}
			got, set, err := goMemoryLimit(tc.goMemLimit, tc.containerLimit, tc.executable)
			if (err != nil) != tc.wantErr || set != tc.wantSet || got != tc.want {
				t.Errorf("goMemoryLimit(%q, %q) = %d, %v, %v; want %d, %v, error %v", tc.goMemLimit, tc.containerLimit, got, set, err, tc.want, tc.wantSet, tc.wantErr)
			}
		})
	}
}

// TestGoMemoryLimitLeavesRoomForTheExecutable: Go's memory limit counts the heap, not the pages
// of the executable the kernel charges to the container too; the two together must fit the
// container's limit, or the kernel reclaims or kills before the collector works harder.
func TestGoMemoryLimitLeavesRoomForTheExecutable(t *testing.T) {
	const container = 256 << 20
	limit, set, err := goMemoryLimit("", "256Mi", executableMapped)
	if err != nil || !set {
		t.Fatalf("goMemoryLimit: %d, %v, %v", limit, set, err)
	}
	executable, err := executableMapped()
	if err != nil {
		t.Fatal(err)
	}
	if limit+executable > container {
		t.Errorf("Go's limit %d MiB and the executable's %d MiB exceed the container's 256 MiB", limit>>20, executable>>20)
	}
	// What is mapped of the executable is at most the file (its debug sections are not mapped).
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.Stat(exe)
	if err != nil {
		t.Fatal(err)
	}
	if page := int64(os.Getpagesize()); executable > file.Size()+3*page || executable < file.Size()/4 {
		t.Errorf("%d bytes of %s mapped, a file of %d", executable, exe, file.Size())
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
