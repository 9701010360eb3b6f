package controllers

import (
	"hash/maphash"
	"maps"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// What the cached objects share. Decoding gives each object its own copy of every string and
// map, and a thousand clusters' objects repeat most of them: namespaces, label keys and values,
// owners, sizes. The cache's transforms point them at one copy instead. Nothing changes a cached
// object (the cache hands out copies; the transforms run before it holds one), so nothing changes
// what they share.

// sharedStorage holds the storage sizes of the cached claims and the StatefulSets' claim
// templates.
var sharedStorage = storageLists{lists: map[string]corev1.ResourceList{}}

// maxSharedSizes bounds how many sizes sharedStorage holds: a fleet has few, and past it (claims
// labelled as the operator's by someone else, all of different sizes) a list is just not shared.
const maxSharedSizes = 256

// storageLists give one list (of storage only, the one resource the operator reads of a volume)
// per size, shared by every cached object of that size.
type storageLists struct {
	mu    sync.Mutex
	lists map[string]corev1.ResourceList
}

// of is the shared list of the storage size in list; nil when it has none.
func (s *storageLists) of(list corev1.ResourceList) corev1.ResourceList {
	size, ok := list[corev1.ResourceStorage]
	if !ok {
		return nil
	}
	key := size.String()
	s.mu.Lock()
	defer s.mu.Unlock()
	if shared, ok := s.lists[key]; ok {
		return shared
	}
	shared := corev1.ResourceList{corev1.ResourceStorage: size}
	if len(s.lists) < maxSharedSizes {
		s.lists[key] = shared
	}
	return shared
}

// sharedMetadata holds the strings and label sets of the cached objects' metadata.
var sharedMetadata = newMetadataTable()

// maxSharedMetadata bounds sharedMetadata; past it, it starts afresh (what is cached keeps what it
// shares; only later objects share anew). A cluster's own strings and label sets are about ten
// (its name, UIDs, revisions), so a fleet of several thousand clusters fits.
const maxSharedMetadata = 1 << 16

// metadataTable gives one copy of each string, and one map of each set of labels.
type metadataTable struct {
	mu      sync.Mutex
	strings map[string]string
	// labels are the label sets by the hash of their keys and values (labelsHash), unequal sets
	// with the same hash side by side.
	labels  map[uint64][]map[string]string
	entries int
	seed    maphash.Seed
}

func newMetadataTable() *metadataTable {
	return &metadataTable{strings: map[string]string{}, labels: map[uint64][]map[string]string{}, seed: maphash.MakeSeed()}
}

// sharingMetadata makes the metadata of obj, a cached object, use sharedMetadata: its namespace,
// labels, annotations' keys, owners and finalizers (not its name or UID, its own). The values of
// annotations are mostly each object's own (the digests of cachedIntent). A pod's labels are one
// map of its own (its name, its revision) of shared strings; other objects' labels, one map per set
// (a cluster's claims have the same, as have the objects the operator applies).
func sharingMetadata(obj any) any {
	o, ok := obj.(metav1.Object)
	if !ok {
		return obj
	}
	t := sharedMetadata
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.entries >= maxSharedMetadata {
		t.strings, t.labels, t.entries = map[string]string{}, map[uint64][]map[string]string{}, 0
	}
	o.SetNamespace(t.string(o.GetNamespace()))
	if labels := o.GetLabels(); len(labels) > 0 {
		if _, pod := obj.(*corev1.Pod); pod {
			o.SetLabels(t.stringsOf(labels))
		} else {
			o.SetLabels(t.labelSet(labels))
		}
	}
	if annotations := o.GetAnnotations(); len(annotations) > 0 {
		shared := make(map[string]string, len(annotations))
		for k, v := range annotations {
			shared[t.string(k)] = v
		}
		o.SetAnnotations(shared)
	}
	owners := o.GetOwnerReferences()
	for i := range owners {
		owners[i].APIVersion, owners[i].Kind, owners[i].Name = t.string(owners[i].APIVersion), t.string(owners[i].Kind), t.string(owners[i].Name)
		owners[i].UID = types.UID(t.string(string(owners[i].UID)))
		owners[i].Controller, owners[i].BlockOwnerDeletion = sharedBool(owners[i].Controller), sharedBool(owners[i].BlockOwnerDeletion)
	}
	finalizers := o.GetFinalizers()
	for i := range finalizers {
		finalizers[i] = t.string(finalizers[i])
	}
	return obj
}

// string is the table's copy of s (t.mu held).
func (t *metadataTable) string(s string) string {
	if s == "" {
		return s
	}
	if shared, ok := t.strings[s]; ok {
		return shared
	}
	t.strings[s] = s
	t.entries++
	return s
}

// stringsOf is a map of the table's copies of the keys and values of m (t.mu held).
func (t *metadataTable) stringsOf(m map[string]string) map[string]string {
	shared := make(map[string]string, len(m))
	for k, v := range m {
		shared[t.string(k)] = t.string(v)
	}
	return shared
}

// labelSet is the table's map equal to labels (t.mu held).
func (t *metadataTable) labelSet(labels map[string]string) map[string]string {
	h := labelsHash(t.seed, labels)
	for _, set := range t.labels[h] {
		if maps.Equal(set, labels) {
			return set
		}
	}
	set := t.stringsOf(labels)
	t.labels[h] = append(t.labels[h], set)
	t.entries++
	return set
}

// labelsHash hashes the keys and values of labels in the keys' order.
func labelsHash(seed maphash.Seed, labels map[string]string) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		h.WriteString(k)
		h.WriteByte(0)
		h.WriteString(labels[k])
		h.WriteByte(0)
	}
	return h.Sum64()
}

// sharedTrue and sharedFalse are what the cached objects' owner references point at.
var sharedTrue, sharedFalse = true, false

func sharedBool(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return &sharedTrue
	default:
		return &sharedFalse
	}
}
