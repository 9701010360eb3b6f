package plan

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// Claim is what Kubernetes says about one member's data claim.
type Claim struct {
	Name string
	UID  types.UID
	// Bound: the claim has its volume; only then may the size it asks for change.
	Bound bool
	// Class is its StorageClass ("" for none).
	Class string
	// Requested is the size it asks for; Capacity the size its volume has (zero while unbound).
	Requested, Capacity resource.Quantity
	// ResizePendingSince: the volume has grown, and its file system is grown only when a pod
	// mounts it again (condition FileSystemResizePending, since then); zero otherwise.
	ResizePendingSince time.Time
}

// ClaimUpdate is what the operator applies to a member's claim (specs.MemberClaim): the label
// with the cluster's UID and, unless zero, the size it asks for (From: before). To expand a claim,
// Size is storage.size (the StorageClass's provisioner then grows the volume); to adopt one, the
// size it asks for already, so an apply of labels alone never gives up a size the operator
// applied before. UID, when known, is a precondition: a claim deleted meanwhile is never
// re-created.
type ClaimUpdate struct {
	Name       string
	UID        types.UID
	Size, From resource.Quantity
}

// adoptedClaims are the updates that adopt the named leftover claims.
func adoptedClaims(kvc *kvv1.KVCluster, obs Observation, names []string) []ClaimUpdate {
	var out []ClaimUpdate
	for _, name := range names {
		update := ClaimUpdate{Name: name}
		if ord, ok := specs.OrdinalOfClaim(kvc, name); ok {
			if c, seen := obs.Claims[ord]; seen && c.Name == name {
				update.UID, update.Size, update.From = c.UID, c.Requested, c.Requested
			}
		}
		out = append(out, update)
	}
	return out
}

// volumeGrowth is how far the members' volumes are from storage.size.
type volumeGrowth struct {
	// expand are the claims to ask for storage.size now.
	expand []ClaimUpdate
	// growing are the claims on their way to it: being expanded, or waiting for their volume
	// before they can be (a member added after the spec grew starts on the StatefulSet's template).
	growing []string
	// problem is why some claims cannot be expanded; it needs a person.
	problem string
}

func (g volumeGrowth) pending() bool { return len(g.expand) > 0 || len(g.growing) > 0 }

// planVolumeGrowth compares each member's claim with storage.size. Claims of members being
// removed are left alone.
func planVolumeGrowth(kvc *kvv1.KVCluster, obs Observation) volumeGrowth {
	want := specs.StorageSize(kvc)
	var g volumeGrowth
	refused := map[string][]string{} // claims by why they cannot grow
	for _, ord := range slices.Sorted(maps.Keys(obs.Claims)) {
		c := obs.Claims[ord]
		if ord >= int(kvc.Spec.Partitions) {
			continue
		}
		asked := c.Requested.Cmp(want) >= 0
		switch {
		case asked && (!c.Bound || c.Capacity.Cmp(want) >= 0): // there (or a new claim, not growth)
		case asked && !c.ResizePendingSince.IsZero():
			g.growing = append(g.growing, fmt.Sprintf("%s has %s, its file system grows when its member restarts", c.Name, c.Capacity.String()))
		case asked:
			g.growing = append(g.growing, fmt.Sprintf("%s has %s", c.Name, c.Capacity.String()))
		case !c.Bound:
			g.growing = append(g.growing, c.Name+" waits for its volume")
		case c.Class == "":
			refused["have no StorageClass"] = append(refused["have no StorageClass"], c.Name)
		default:
			switch allowed, known := obs.ExpandableClasses[c.Class]; {
			case !known:
				why := fmt.Sprintf("have StorageClass %s, which does not exist", c.Class)
				refused[why] = append(refused[why], c.Name)
			case !allowed:
				why := fmt.Sprintf("have StorageClass %s, which does not allow volume expansion", c.Class)
				refused[why] = append(refused[why], c.Name)
			default:
				g.expand = append(g.expand, ClaimUpdate{Name: c.Name, UID: c.UID, Size: want, From: c.Requested})
			}
		}
	}
	if len(refused) > 0 {
		var whys []string
		for _, why := range slices.Sorted(maps.Keys(refused)) {
			whys = append(whys, fmt.Sprintf("claims %s %s", strings.Join(refused[why], ", "), why))
		}
		g.problem = fmt.Sprintf("storage.size is %s, but the members' volumes cannot grow to it: %s. If the StorageClass's provisioner can "+
			"expand volumes, set allowVolumeExpansion: true on it; until then the members keep their volumes, and the quota those hold",
			want.String(), strings.Join(whys, "; "))
	}
	return g
}

// restartsForResize are the member pods with each one whose claim waits for a pod to mount it
// again to grow its file system (a driver that cannot while the volume is in use) marked
// outdated, so the rollout restarts them one at a time. A pod made after the claim began to wait
// has mounted it since: it is not restarted again.
func restartsForResize(obs Observation) map[int]Pod {
	pods, copied := obs.Pods, false
	for ord, c := range obs.Claims {
		p, ok := pods[ord]
		if !ok || c.ResizePendingSince.IsZero() || p.Outdated || !p.Created.Before(c.ResizePendingSince) {
			continue
		}
		if !copied { // the caller's map stays as observed
			pods, copied = maps.Clone(obs.Pods), true
		}
		p.Outdated = true
		pods[ord] = p
	}
	return pods
}

// message says how far the volumes are, for the Reconciling condition.
func (g volumeGrowth) message(kvc *kvv1.KVCluster) string {
	want := specs.StorageSize(kvc)
	parts := g.growing
	for _, e := range g.expand {
		parts = append(parts, fmt.Sprintf("%s asks for %s", e.Name, e.From.String()))
	}
	return fmt.Sprintf("expanding the members' volumes to %s: %s", want.String(), strings.Join(parts, ", "))
}

// recordedVolumeSize is status.volumeSize: storage.size once every member's claim is bound to a
// volume that large. It only grows, so a member added later on a claim still to be expanded does
// not take the quota back down (and every member with it).
func recordedVolumeSize(kvc *kvv1.KVCluster, obs Observation) *resource.Quantity {
	previous, want := kvc.Status.VolumeSize, specs.StorageSize(kvc)
	if previous != nil && previous.Cmp(want) >= 0 {
		return previous
	}
	for ord := range int(kvc.Spec.Partitions) {
		if c, ok := obs.Claims[ord]; !ok || !c.Bound || c.Capacity.Cmp(want) < 0 {
			return previous
		}
	}
	return &want
}

// membersQuota is the backend quota members run with: specs.QuotaBackendBytes of the size every
// member's volume is known to have (knownVolumeSize). A spec quota raised together with
// storage.size, more than the present volumes hold, waits for them with the quota the members
// have now, rather than restarting them twice. A quota below the one the members run that is not
// the spec's own value (the default, or a spec quota an earlier release admitted, both of which
// gave the volume's WAL too little room) is taken only once every member's database fits well
// under it; until then the members keep theirs: a quota below a database raises NOSPACE.
func membersQuota(kvc *kvv1.KVCluster, obs Observation, recorded *resource.Quantity) int64 {
	quota := specs.QuotaBackendBytes(kvc, knownVolumeSize(kvc, obs, recorded))
	spec, running := kvc.Spec.Space.BackendQuota, obs.STSQuota
	switch {
	case spec != nil && spec.Value() <= quota, running == 0:
		return quota
	case running <= quota:
		if spec != nil {
			return running
		}
		return quota
	case databasesFitUnder(obs, quota):
		return quota
	case spec != nil:
		return min(running, spec.Value())
	}
	return running
}

// databasesFitUnder: every member answered this reconcile with a database file of at most half
// the quota, below where routine defragmentation (half the quota) and SpacePressure (80%) start,
// so a lower quota is taken once and not lowered again after the next defragmentation.
func databasesFitUnder(obs Observation, quota int64) bool {
	if obs.Cluster == nil || len(obs.Cluster.Members) == 0 {
		return false
	}
	for _, m := range obs.Cluster.Members {
		if !m.Healthy || m.DBSize == 0 || m.DBSize > quota/2 {
			return false
		}
	}
	return true
}

// knownVolumeSize is the size every member's volume is known to have: status.volumeSize once
// recorded; before, the smallest of storage.size and the members' bound volumes (adopted claims
// may be smaller), or without any the size the StatefulSet's claims were made with.
func knownVolumeSize(kvc *kvv1.KVCluster, obs Observation, recorded *resource.Quantity) resource.Quantity {
	if recorded != nil {
		return *recorded
	}
	size, bound := specs.StorageSize(kvc), false
	for ord, c := range obs.Claims {
		if ord < int(kvc.Spec.Partitions) && c.Bound {
			bound = true
			if c.Capacity.Cmp(size) < 0 {
				size = c.Capacity
			}
		}
	}
	if !bound && !obs.STSClaimSize.IsZero() {
		return obs.STSClaimSize
	}
	return size
}

// volumesGrown: every member's volume has just reached a new size (recorded); before is the quota
// the members run with.
func volumesGrown(kvc *kvv1.KVCluster, obs Observation, recorded *resource.Quantity) (grown bool, before int64) {
	previous := kvc.Status.VolumeSize
	if previous == nil || recorded == nil || recorded.Cmp(*previous) <= 0 {
		return false, 0
	}
	before = obs.STSQuota
	if before == 0 {
		before = membersQuota(kvc, obs, previous)
	}
	return true, before
}

// volumesGrownEvent announces that every member's volume reached a new size, and what it does to
// the quota (now quota).
func volumesGrownEvent(kvc *kvv1.KVCluster, obs Observation, recorded *resource.Quantity, quota int64) []Event {
	grown, before := volumesGrown(kvc, obs, recorded)
	if !grown {
		return nil
	}
	msg := fmt.Sprintf("every member's volume has %s now (was %s)", recorded.String(), kvc.Status.VolumeSize.String())
	if before != quota {
		msg += fmt.Sprintf(": the backend quota goes from %s to %s, members restart one at a time to take it", sizeOf(before), sizeOf(quota))
	}
	return []Event{{Type: corev1.EventTypeNormal, Reason: EventVolumesExpanded, Action: "ExpandVolumes", Message: msg}}
}

// sizeOf shows a quota as status.backendQuota does, rounded down to a MiB.
func sizeOf(n int64) string { return resource.NewQuantity(n>>20<<20, resource.BinarySI).String() }
