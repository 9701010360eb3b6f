package controllers

import (
	"bytes"
	"hash/maphash"
	"maps"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// What the cached objects share. Decoding gives each object its own copy of every string and
// map, and a thousand clusters' objects repeat most of them: namespaces, label keys and values,
// owners, sizes. The cache's transforms point them at one copy instead. So nothing may change a
// cached object in place: not the readers of the cache (it hands them copies), nor the event
// handlers, predicates and index functions, which get the cached object itself and only read it.

// sharedStorage holds the storage sizes of the cached claims and the StatefulSets' claim
// templates.
var sharedStorage = storageLists{lists: map[string]corev1.ResourceList{}}

// maxSharedSizes bounds how many sizes sharedStorage holds: a fleet has few, which its claims keep
// for their life; past it (claims labelled as the operator's by someone else, all of different
// sizes) a list is just not shared.
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

// sharedRunning is the state of every running container of the cached pods (since when is not
// read).
var sharedRunning corev1.ContainerStateRunning

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

// sharedMetadata holds the strings and label sets of the cached objects' metadata.
var sharedMetadata = newMetadataTable()

// maxSharedMetadataBytes bounds sharedMetadata by what it holds (estimated: a string's bytes and
// its entry, a set's map); past it, it starts afresh. What is cached keeps what it shares, and
// only objects cached later share anew: for a while two copies of a string are held, not more. It
// holds too what objects since deleted shared (Jobs' names, old revisions) until then. A cluster's
// own strings and label sets are about ten (its name, UIDs, revisions), so a fleet of thousands of
// clusters stays well under the bound (an estimate from the entry sizes below; not measured).
const maxSharedMetadataBytes = 8 << 20

// metadataTable gives one copy of each string, and one map of each set of labels.
type metadataTable struct {
	mu      sync.Mutex
	strings map[string]string
	// labels are the label sets by the hash of their keys and values (labelsHash), unequal sets
	// with the same hash side by side.
	labels map[uint64][]map[string]string
	bytes  int
	seed   maphash.Seed
}

// Estimates of what a table entry holds besides its strings' bytes: a string's header twice in a
// map slot with its share of the map's control bytes and growth; a set's map (Go's maps hold
// eight entries per group) and its slot.
const (
	stringEntryBytes = 40
	labelSetBytes    = 64
	labelEntryBytes  = 40
)

func newMetadataTable() *metadataTable {
	return &metadataTable{strings: map[string]string{}, labels: map[uint64][]map[string]string{}, seed: maphash.MakeSeed()}
}

// sharingMetadata makes the metadata of obj, a cached object, use sharedMetadata (share).
func sharingMetadata(obj any) any { return sharedMetadata.share(obj) }

// share makes the metadata of obj use the table's copies: its namespace, labels, annotations'
// keys, owners and finalizers (not its name or UID, its own). The values of annotations are
// mostly each object's own (the digests of cachedIntent). Labels are one map per set: a
// cluster's claims have the same, as have the objects the operator applies, and its member pods
// of one revision (as cachedForm leaves them).
func (t *metadataTable) share(obj any) any {
	o, ok := obj.(metav1.Object)
	if !ok {
		return obj
	}
	labels := o.GetLabels()
	var hash uint64
	if len(labels) > 0 {
		hash = labelsHash(t.seed, labels)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bytes >= maxSharedMetadataBytes {
		t.strings, t.labels, t.bytes = map[string]string{}, map[uint64][]map[string]string{}, 0
	}
	o.SetNamespace(t.intern(o.GetNamespace()))
	if len(labels) > 0 {
		o.SetLabels(t.labelSet(hash, labels))
	}
	if annotations := o.GetAnnotations(); len(annotations) > 0 {
		shared := make(map[string]string, len(annotations))
		for k, v := range annotations {
			shared[t.intern(k)] = v
		}
		o.SetAnnotations(shared)
	}
	owners := o.GetOwnerReferences()
	for i := range owners {
		owners[i].APIVersion, owners[i].Kind, owners[i].Name = t.intern(owners[i].APIVersion), t.intern(owners[i].Kind), t.intern(owners[i].Name)
		owners[i].UID = types.UID(t.intern(string(owners[i].UID)))
		owners[i].Controller, owners[i].BlockOwnerDeletion = sharedBool(owners[i].Controller), sharedBool(owners[i].BlockOwnerDeletion)
	}
	finalizers := o.GetFinalizers()
	for i := range finalizers {
		finalizers[i] = t.intern(finalizers[i])
	}
	return obj
}

// intern is the table's copy of s (t.mu held).
func (t *metadataTable) intern(s string) string {
	if s == "" {
		return s
	}
	if shared, ok := t.strings[s]; ok {
		return shared
	}
	t.strings[s] = s
	t.bytes += len(s) + stringEntryBytes
	return s
}

// internAll is a map of the table's copies of the keys and values of m (t.mu held).
func (t *metadataTable) internAll(m map[string]string) map[string]string {
	shared := make(map[string]string, len(m))
	for k, v := range m {
		shared[t.intern(k)] = t.intern(v)
	}
	return shared
}

// labelSet is the table's map equal to labels, whose labelsHash is hash (t.mu held).
func (t *metadataTable) labelSet(hash uint64, labels map[string]string) map[string]string {
	for _, set := range t.labels[hash] {
		if maps.Equal(set, labels) {
			return set
		}
	}
	set := t.internAll(labels)
	t.labels[hash] = append(t.labels[hash], set)
	t.bytes += labelSetBytes + labelEntryBytes*len(set)
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

// sharedCAs holds the CA certificates of the cached Secrets. Each of a cluster's TLS Secrets
// carries its CA's certificate (ca.crt), and the CA's own Secret carries it twice (tls.crt too):
// five copies of one certificate a cluster, one once shared. Only certificates are held here, never
// a key.
var sharedCAs = newCertificateTable()

// maxSharedCABytes bounds sharedCAs by the bytes of the certificates it holds; past it, it starts
// afresh, as sharedMetadata does. A CA certificate is about 600 bytes (two while a rotation
// runs): thousands of clusters' fit.
const maxSharedCABytes = 4 << 20

// certificateTable gives one copy of each certificate (PEM bytes).
type certificateTable struct {
	mu sync.Mutex
	// pems are the certificates by the hash of their bytes, unequal ones with the same hash side
	// by side.
	pems  map[uint64][][]byte
	bytes int
	seed  maphash.Seed
}

func newCertificateTable() *certificateTable {
	return &certificateTable{pems: map[uint64][][]byte{}, seed: maphash.MakeSeed()}
}

// sharingCAs makes a cached Secret's CA certificate, and any of its values equal to it, the
// table's copy (sharedCAs.share); other objects are left as they are.
func sharingCAs(obj any) any {
	if secret, ok := obj.(*corev1.Secret); ok {
		sharedCAs.share(secret)
	}
	return obj
}

// share points secret's ca.crt, and its values equal to it, at the table's copy of it. It changes
// secret in place (the informer's own copy).
func (t *certificateTable) share(secret *corev1.Secret) {
	ca := secret.Data[specs.CACertKey]
	if len(ca) == 0 {
		return
	}
	hash := maphash.Bytes(t.seed, ca)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bytes >= maxSharedCABytes {
		t.pems, t.bytes = map[uint64][][]byte{}, 0
	}
	shared := t.intern(hash, ca)
	for k, v := range secret.Data {
		if bytes.Equal(v, shared) {
			secret.Data[k] = shared
		}
	}
}

// intern is the table's copy of pem, whose hash is hash (t.mu held).
func (t *certificateTable) intern(hash uint64, pem []byte) []byte {
	for _, held := range t.pems[hash] {
		if bytes.Equal(held, pem) {
			return held
		}
	}
	t.pems[hash] = append(t.pems[hash], pem)
	t.bytes += len(pem)
	return pem
}
