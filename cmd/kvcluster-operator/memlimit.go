package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// goMemoryLimit is the Go runtime's memory limit for a container whose memory limit is
// containerLimit (MEMORY_LIMIT: bytes from the downward API, or a quantity such as 256Mi). Go's
// limit counts the memory the runtime manages, not the pages of the executable, which the kernel
// charges to the container as they are read (41 of the operator's 49 MiB within seconds of a
// start, in the fleet benchmark). So the limit is 90 % of what the executable leaves, the rest
// being for what else the runtime does not count. Near it the garbage collector works harder
// instead of the heap growing until the kernel evicts the executable's pages or kills the
// operator. GOMEMLIMIT, when set, is left alone.
func goMemoryLimit(goMemLimit, containerLimit string, executable func() (int64, error)) (int64, bool, error) {
	if goMemLimit != "" || containerLimit == "" {
		return 0, false, nil
	}
	q, err := resource.ParseQuantity(containerLimit)
	if err != nil || q.Value() <= 0 {
		return 0, false, fmt.Errorf("MEMORY_LIMIT=%q is not a memory size (bytes, or a quantity such as 256Mi)", containerLimit)
	}
	exe, err := executable()
	if err != nil {
		return 0, false, fmt.Errorf("the executable's size in memory: %w", err)
	}
	if q.Value() <= exe {
		return 0, false, fmt.Errorf("MEMORY_LIMIT=%q leaves nothing beside the operator's executable (%d MiB mapped)", containerLimit, exe>>20)
	}
	return (q.Value() - exe) / 10 * 9, true, nil
}

// executableMapped is the size of the operator's own executable as mapped into its memory: pages
// the kernel counts against the container's memory limit as they are read, which Go's memory
// limit does not count.
func executableMapped() (int64, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, err
	}
	exe = filepath.Clean(exe)
	maps, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	defer maps.Close()
	var size int64
	lines := bufio.NewScanner(maps)
	for lines.Scan() {
		// address perms offset dev inode pathname
		fields := strings.Fields(lines.Text())
		if len(fields) < 6 || strings.Join(fields[5:], " ") != exe {
			continue
		}
		from, to, ok := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(from, 16, 64)
		end, err2 := strconv.ParseUint(to, 16, 64)
		if !ok || err1 != nil || err2 != nil || end < start {
			return 0, fmt.Errorf("/proc/self/maps: cannot read the address range %q", fields[0])
		}
		size += int64(end - start)
	}
	if err := lines.Err(); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, fmt.Errorf("/proc/self/maps maps nothing of %s", exe)
	}
	return size, nil
}
