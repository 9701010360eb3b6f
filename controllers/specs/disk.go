package specs

import (
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// What a member's volume must hold, measured with etcd 3.7.3 on ext4 volumes (see the README's
// "Disk space"), besides its database file (at most the backend quota):
//   - the write-ahead log, in segments of walSegmentBytes plus a preallocated next one. A segment
//     is deleted once a snapshot covers it and more than --max-wals are left, by a purge every
//     30 s. Until a snapshot (every --snapshot-count entries) every segment written is kept: with
//     etcd's default of 10,000 entries, 100 KiB values wrote 15 segments (960 MB) while the
//     database held 34 MB, and the member exited on "no space left on device", unable to restart
//     until its volume grew;
//   - a second database file for a while: a defragmentation writes the data in use to a new file
//     before replacing the old one (without room it fails, and leaves the part written behind for
//     good), and a member that fell behind receives the leader's database beside its own;
//   - the file system's own share: 88.5% of a 1 GiB ext4 volume was left for a process that is
//     not root (journal, inode tables, 5% reserved for root), as etcd runs here.
//
// Snapshots every 78 entries cost no throughput measurable on the test machine (3 members;
// 100-byte and 100 KiB puts, within run-to-run noise of 1,000 and 10,000; see the README).
// Segments written faster than the 30 s purge removes them are not bounded by any flag: the
// default quota's second half is their room too (on 1Gi, 30 s at 11 MB/s with a full database).
const (
	// walSegmentBytes is the size of etcd's WAL segments (wal.SegmentSizeBytes).
	walSegmentBytes = 64 * 1000 * 1000
	// maxEntryBytes bounds one WAL entry: etcd refuses requests over --max-request-bytes (1.5 MiB
	// by default, which the members keep); a little is added for the entry's own framing.
	maxEntryBytes = 1536*1024 + 64*1024
	// walGrowthSegments is how many segments the WAL may grow by between two snapshots, so
	// snapshotCount entries of the largest size fit in them.
	walGrowthSegments = 2
	// snapshotCount makes a member snapshot often enough that walGrowthSegments hold the entries
	// between two snapshots, whatever their size.
	snapshotCount = walGrowthSegments * walSegmentBytes / maxEntryBytes
	// maxWALs is how many segments a member keeps (etcd's default is 5): as many as it writes
	// between two snapshots anyway (the growth and the one partly written when the last snapshot
	// was taken); older ones serve nothing the snapshot does not.
	maxWALs = walGrowthSegments + 1
	// walBytes is the most the WAL occupies after each purge: the segments kept and the
	// preallocated next one.
	walBytes = (maxWALs + 1) * walSegmentBytes
	// usableShare is the share of a volume the file system leaves a non-root process, in
	// percent, with a margin below the 88.5% measured.
	usableShare = 85
	// maxQuotaBytes is etcd's recommended upper limit for the backend database; minQuotaBytes is
	// admission's lower one, which a volume smaller than admission allows (made by an earlier
	// release) still gets: a quota of 0 would be etcd's default, 2 GiB.
	maxQuotaBytes = 8 << 30
	minQuotaBytes = 16 << 20
)

// MaxQuotaBytes is the largest backend quota a volume of the given size holds: what the file
// system leaves once the WAL has its room, and at most etcd's recommended 8 GiB. A quota this
// large leaves no room for the second database file, so a defragmentation or a member catching
// up on a snapshot may fill the disk near the quota; admission refuses larger ones (the same
// arithmetic, in the API's rules).
func MaxQuotaBytes(volume resource.Quantity) int64 {
	return min(besideTheWAL(volume), maxQuotaBytes)
}

// besideTheWAL is what the file system leaves of a volume once the WAL has its room.
func besideTheWAL(volume resource.Quantity) int64 {
	return max(volume.Value()*usableShare/100-walBytes, 0)
}

// QuotaBackendBytes is the quota for members on volumes of the given size (zero: storage.size):
// spec.space.backendQuota, or by default half of what the volume holds beside the WAL (at most
// 8 GiB), so a second database file fits beside the first and etcd raises its NOSPACE alarm and
// refuses writes before the disk itself fills up. Never more than MaxQuotaBytes, which a quota
// raised together with storage.size exceeds until the volumes have grown; never less than 16 MiB.
func QuotaBackendBytes(kvc *kvv1.KVCluster, volume resource.Quantity) int64 {
	if volume.IsZero() {
		volume = StorageSize(kvc)
	}
	limit := MaxQuotaBytes(volume)
	if q := kvc.Spec.Space.BackendQuota; q != nil {
		return max(min(q.Value(), limit), minQuotaBytes)
	}
	return max(min(besideTheWAL(volume)/2, maxQuotaBytes), minQuotaBytes)
}

// walArgs keep the WAL within walBytes.
func walArgs() []string {
	return []string{"--snapshot-count=" + strconv.Itoa(snapshotCount), "--max-wals=" + strconv.Itoa(maxWALs)}
}
