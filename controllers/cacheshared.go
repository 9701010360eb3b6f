package controllers

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// What the cached objects share. Decoding gives each object its own copy of every map, and a
// thousand clusters' claims repeat a few sizes. The cache's transforms point them at one copy
// instead. Nothing changes a cached object (the cache hands out copies; the transforms run before
// it holds one), so nothing changes what they share.

// sharedStorage holds the storage sizes of the cached claims and the StatefulSets' claim
// templates.
var sharedStorage = storageLists{lists: map[string]corev1.ResourceList{}}

// maxSharedSizes bounds how many sizes sharedStorage holds: a fleet has few, and past it (claims
// labelled as the operator's by someone else, all of different sizes) a list is just not shared.
const maxSharedSizes = 256

// storageLists give one list (of storage only, the one resource the operator reads of a volume)
// per size, shared by every cached object of that size. Nothing changes a cached object (the cache
// hands out copies), so neither does anything change a shared list.
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
