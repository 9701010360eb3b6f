// Package backup takes, keeps and restores etcd snapshots. It is both what the operator's backup
// and restore programs run (cmd/kvcluster-operator's backup, restore-fetch and restore-apply
// subcommands) and the arithmetic the controller decides with:
//
//   - schedule: parsing backup schedules, finding the slot due and naming its Job. These functions
//     are pure — they take `now` as an argument — so the reconciler stays a thin loop around them
//     and their tests are tables of times.
//   - snapshot, store, retention: streaming a snapshot from a member into a Store (a bucket, or a
//     directory on a mounted PersistentVolumeClaim), reading it back to verify it, and pruning
//     older ones. These do I/O against etcd and the store.
//   - restore: fetching a snapshot and restoring a member's data dir from it, in a restoring
//     member's init containers.
package backup
