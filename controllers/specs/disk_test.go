package specs

import (
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// What etcd 3.7.3 does with a disk, as measured on a 1 GiB ext4 volume (kept apart from the
// model in disk.go, which this test checks against it).
const (
	measuredSegmentBytes = 64_000_000 // each WAL file, and the preallocated next one
	measuredUsableShare  = 0.885      // of the volume, for a process that is not root (df avail)
	defaultSnapshotCount = 10000      // etcd's, when --snapshot-count is not given
	defaultMaxWALs       = 5
	largestRequestBytes  = 1536 * 1024 // --max-request-bytes' default: the largest WAL entry
)

// TestTheDiskHoldsWhatAMemberWrites: whatever the volume, a member's flags keep the worst its
// disk holds within what the file system gives it: the WAL (the segments written between two
// snapshots of the largest entries, at least --max-wals, and the preallocated next one) beside the
// database at its quota, and by default a second database file (a defragmentation's copy, a
// snapshot received from the leader). With etcd's own WAL settings, 100 KiB values filled a
// 1 GiB volume with WAL while the database held 34 MB.
func TestTheDiskHoldsWhatAMemberWrites(t *testing.T) {
	for _, size := range []string{"512Mi", "1Gi", "2Gi", "10Gi", "100Gi"} {
		volume := resource.MustParse(size)
		usable := measuredUsableShare * float64(volume.Value())
		tests := []struct {
			name      string
			quota     *resource.Quantity
			databases int64
		}{
			{name: "default quota", databases: 2},
			{name: "the largest quota admitted", quota: resource.NewQuantity(MaxQuotaBytes(volume), resource.BinarySI), databases: 1},
		}
		for _, tt := range tests {
			kvc := &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: "kv", Namespace: "ns"}}
			kvc.Spec.Storage.Size = volume
			kvc.Spec.Space.BackendQuota = tt.quota
			flags := map[string]int64{"snapshot-count": defaultSnapshotCount, "max-wals": defaultMaxWALs}
			for _, arg := range EtcdArgs(kvc, DesiredTransport(kvc), QuotaBackendBytes(kvc, volume)) {
				name, value, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
				if n, err := strconv.ParseInt(value, 10, 64); err == nil {
					flags[name] = n
				}
			}
			written := (flags["snapshot-count"]*largestRequestBytes + measuredSegmentBytes - 1) / measuredSegmentBytes
			wal := (max(flags["max-wals"], written+1) + 1) * measuredSegmentBytes
			need := tt.databases*flags["quota-backend-bytes"] + wal
			if float64(need) > usable {
				t.Errorf("%s, %s: a member may need %d MiB (WAL %d MiB, quota %d MiB × %d), the file system gives %d MiB",
					size, tt.name, need>>20, wal>>20, flags["quota-backend-bytes"]>>20, tt.databases, int64(usable)>>20)
			}
			if flags["quota-backend-bytes"] < 64<<20 {
				t.Errorf("%s, %s: quota %d MiB, want at least 64 MiB of data", size, tt.name, flags["quota-backend-bytes"]>>20)
			}
		}
	}
}
