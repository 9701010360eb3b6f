package certs

import (
	"crypto/tls"
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
// It remembers at most limit sessions, one per server; past it, the one put longest ago goes.
type compactSessions struct {
	limit int

	mu       sync.Mutex
	sessions map[string]storedSession
	order    []string // keys, put longest ago first
}

type storedSession struct {
	ticket, state []byte
}

func newCompactSessions(limit int) *compactSessions {
	return &compactSessions{limit: limit, sessions: map[string]storedSession{}}
}

// Get returns the session kept for key, parsed, or none when none is kept or it no longer parses.
func (c *compactSessions) Get(key string) (*tls.ClientSessionState, bool) {
	c.mu.Lock()
	stored, ok := c.sessions[key]
	c.mu.Unlock()
	if !ok {
		return nil, false
	}
	state, err := tls.ParseSessionState(stored.state)
	if err != nil {
		return nil, false
	}
	session, err := tls.NewResumptionState(stored.ticket, state)
	if err != nil {
		return nil, false
	}
	return session, true
}

// Put keeps session for key, serialized; a nil session forgets key's (Go's client does so when a
// session can no longer be used).
func (c *compactSessions) Put(key string, session *tls.ClientSessionState) {
	var stored storedSession
	if session != nil {
		ticket, state, err := session.ResumptionState()
		if err != nil || state == nil {
			session = nil
		} else if serialized, err := state.Bytes(); err != nil {
			session = nil
		} else {
			// Copies of their own length: the ticket is part of the message it came in, and the
			// state is in the buffer its builder grew, with room after it (858 bytes in 1,280).
			stored.ticket, stored.state = slices.Clone(ticket), slices.Clone(serialized)
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
