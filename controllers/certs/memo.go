package certs

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"sync"
	"time"
)

// The operator looks at every cluster again at least once a minute and asks the same questions of
// the same Secrets each time: does this certificate fit, when does it expire, is this a usable CA.
// Answering means parsing certificates, deriving public keys from private ones and verifying
// signatures (about 5 % of the operator's idle CPU at 100 TLS clusters, before answers were kept);
// an answer depends only on the bytes asked about (and, for Check, on the time), so it is
// remembered, keyed by a hash of them.

// memoLimit bounds each memo's newer generation. A cluster asks about four certificates (Expiry),
// three fits (Check) and one CA at each look: answers are kept for fleets of up to several
// thousand clusters; in a larger one, an answer is often dropped before it is asked for again, and
// is worked out anew (what it cost before answers were kept). A memo holds answers only for what
// was asked: a small fleet's stay small.
const memoLimit = 32768

// memo remembers answers in two generations: when the newer one is full it becomes the older, and
// the older is dropped; an answer found in the older is carried into the newer. So what is still
// asked about stays, what is not (a renewed certificate's predecessor) goes, and at most twice
// limit answers are held.
type memo[V any] struct {
	limit int

	mu           sync.Mutex
	newer, older map[[sha256.Size]byte]V
}

func (m *memo[V]) get(key [sha256.Size]byte) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.newer[key]; ok {
		return v, true
	}
	v, ok := m.older[key]
	if ok {
		m.putLocked(key, v)
	}
	return v, ok
}

func (m *memo[V]) put(key [sha256.Size]byte, v V) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.putLocked(key, v)
}

func (m *memo[V]) putLocked(key [sha256.Size]byte, v V) {
	if m.newer == nil || len(m.newer) >= m.limit {
		m.older, m.newer = m.newer, make(map[[sha256.Size]byte]V)
	}
	m.newer[key] = v
}

// digest hashes what an answer depends on: its question and each input, length-prefixed so that
// no two different inputs hash alike by where one ends and the next begins.
func digest(question string, inputs ...[]byte) [sha256.Size]byte {
	h := sha256.New()
	var length [8]byte
	for _, in := range append([][]byte{[]byte(question)}, inputs...) {
		binary.BigEndian.PutUint64(length[:], uint64(len(in)))
		h.Write(length[:])
		h.Write(in)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// window is a stretch of time in which every certificate an answer read is valid (inclusive at
// both ends, as Go's verification is); the answer holds for any time in it. Zero: all time.
type window struct{ from, until time.Time }

// narrow returns w within [notBefore, notAfter].
func (w window) narrow(notBefore, notAfter time.Time) window {
	if w.from.IsZero() || notBefore.After(w.from) {
		w.from = notBefore
	}
	if w.until.IsZero() || notAfter.Before(w.until) {
		w.until = notAfter
	}
	return w
}

func (w window) holds(t time.Time) bool {
	return (w.from.IsZero() || !t.Before(w.from)) && (w.until.IsZero() || !t.After(w.until))
}

type verdict struct {
	err error
	in  window
}

type validity struct {
	notBefore, notAfter time.Time
	err                 error
}

// remembered is err as kept in a memo: its message alone, so no parsed certificate (which x509's
// errors carry) is held with it.
func remembered(err error) error {
	if err == nil {
		return nil
	}
	return errors.New(err.Error())
}

var (
	checked   = memo[verdict]{limit: memoLimit}
	caChecked = memo[error]{limit: memoLimit}
	expiries  = memo[validity]{limit: memoLimit}
)
