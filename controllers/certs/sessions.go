package certs

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"crypto/tls"
	"encoding/pem"
	"slices"
	"sync"
)

// compactSessions is a client's session cache that holds each session as bytes (the ticket and
// the state Go serializes for it), parsed again only when a connection resumes it. Go's own cache
// holds a session parsed: with the member's certificate and its chain as x509 values, several
// times the size of their DER, for every member of every cluster between looks a minute apart. A
// resumed connection parses the member's certificate again (tens of microseconds), where a full
// handshake would verify its chain and sign with the client key.
//
// Most of a state is those certificates, and a cluster's members all serve the same one, from the
// same CA: a state is kept without the certificates the look that put it knew (knownCertificates:
// the cluster's Secrets, which the operator holds anyway), and they are put back from those the
// look that resumes it knows, found by their digest: the state parsed is byte for byte the one Go
// serialized. A session whose certificates that look does not know (a member that served another
// certificate) is not resumed: the connection makes a full handshake.
//
// It remembers at most limit sessions, one per server; past it, the one put longest ago goes.
type compactSessions struct {
	limit int

	mu       sync.Mutex
	sessions map[string]*storedSession // by pointer: a map's slots (eight for three members) stay small
	order    []string                  // keys, put longest ago first
}

type storedSession struct {
	// state is the serialized state without the certificates taken out of it.
	ticket, state []byte
	taken         []takenCertificate
}

// takenCertificate is a certificate taken out of a state: where it goes back in the state as kept
// (in order), and its DER's digest.
type takenCertificate struct {
	at     int
	digest [sha256.Size]byte
}

// knownCertificates are the DER certificates a look at a cluster knows, by their digest.
type knownCertificates map[[sha256.Size]byte][]byte

// certificatesIn are the certificates of the PEM inputs (blocks of other types are skipped).
func certificatesIn(pems ...[]byte) knownCertificates {
	known := knownCertificates{}
	for _, data := range pems {
		for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
			if block.Type == certificateBlock {
				known[sha256.Sum256(block.Bytes)] = block.Bytes
			}
		}
	}
	return known
}

// take returns state without the known certificates in it, and where they were.
func (known knownCertificates) take(state []byte) ([]byte, []takenCertificate) {
	type found struct {
		from, to int
		digest   [sha256.Size]byte
	}
	var spans []found
	for digest, der := range known {
		for from := 0; ; {
			i := bytes.Index(state[from:], der)
			if i < 0 {
				break
			}
			spans = append(spans, found{from + i, from + i + len(der), digest})
			from += i + len(der)
		}
	}
	slices.SortFunc(spans, func(a, b found) int { return cmp.Compare(a.from, b.from) })
	size, n, end := len(state), 0, 0
	for i, s := range spans {
		if s.from < end { // overlaps one taken already
			spans[i].to = -1
			continue
		}
		size, n, end = size-(s.to-s.from), n+1, s.to
	}
	// Both of their own length, as what is kept is.
	kept, taken := make([]byte, 0, size), make([]takenCertificate, 0, n)
	end = 0
	for _, s := range spans {
		if s.to < 0 {
			continue
		}
		kept = append(kept, state[end:s.from]...)
		taken = append(taken, takenCertificate{at: len(kept), digest: s.digest})
		end = s.to
	}
	return append(kept, state[end:]...), taken
}

// restore is the state serialized, the certificates taken out of it put back; false when one of
// them is not known.
func (known knownCertificates) restore(s storedSession) ([]byte, bool) {
	size := len(s.state)
	for _, t := range s.taken {
		der, ok := known[t.digest]
		if !ok {
			return nil, false
		}
		size += len(der)
	}
	if len(s.taken) == 0 {
		return s.state, true
	}
	state := make([]byte, 0, size)
	from := 0
	for _, t := range s.taken {
		state = append(append(state, s.state[from:t.at]...), known[t.digest]...)
		from = t.at
	}
	return append(state, s.state[from:]...), true
}

func newCompactSessions(limit int) *compactSessions {
	return &compactSessions{limit: limit, sessions: map[string]*storedSession{}}
}

// Get and Put with no certificates known: a client configuration not kept per cluster
// (ClientConfig), whose sessions are kept whole.
func (c *compactSessions) Get(key string) (*tls.ClientSessionState, bool) { return c.get(key, nil) }

func (c *compactSessions) Put(key string, session *tls.ClientSessionState) {
	c.put(key, session, nil)
}

// get returns the session kept for key, parsed, or none when none is kept, one of its
// certificates is not known, or it no longer parses.
func (c *compactSessions) get(key string, known knownCertificates) (*tls.ClientSessionState, bool) {
	c.mu.Lock()
	stored, ok := c.sessions[key]
	c.mu.Unlock()
	if !ok {
		return nil, false
	}
	serialized, ok := known.restore(*stored)
	if !ok {
		return nil, false
	}
	state, err := tls.ParseSessionState(serialized)
	if err != nil {
		return nil, false
	}
	session, err := tls.NewResumptionState(stored.ticket, state)
	if err != nil {
		return nil, false
	}
	return session, true
}

// put keeps session for key, serialized without the known certificates; a nil session forgets
// key's (Go's client does so when a session can no longer be used).
func (c *compactSessions) put(key string, session *tls.ClientSessionState, known knownCertificates) {
	stored := &storedSession{}
	if session != nil {
		ticket, state, err := session.ResumptionState()
		if err != nil || state == nil {
			session = nil
		} else if serialized, err := state.Bytes(); err != nil {
			session = nil
		} else {
			// Copies of their own length: the ticket is part of the message it came in, and the
			// state is in the buffer its builder grew, with room after it (858 bytes in 1,280).
			stored.ticket = slices.Clone(ticket)
			stored.state, stored.taken = known.take(serialized)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.order, key); i >= 0 {
		c.order = slices.Delete(c.order, i, i+1)
		delete(c.sessions, key)
	}
	if session == nil {
		return
	}
	if len(c.order) >= c.limit {
		delete(c.sessions, c.order[0])
		c.order = slices.Delete(c.order, 0, 1)
	}
	c.sessions[key] = stored
	c.order = append(c.order, key)
}

// lookSessions are a cluster's kept sessions as one look uses them, with the certificates it
// knows.
type lookSessions struct {
	kept  *compactSessions
	known knownCertificates
}

func (l lookSessions) Get(key string) (*tls.ClientSessionState, bool) {
	return l.kept.get(key, l.known)
}

func (l lookSessions) Put(key string, session *tls.ClientSessionState) {
	l.kept.put(key, session, l.known)
}
