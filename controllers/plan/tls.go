package plan

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/certs"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// How long what the operator issues is valid. Leaves are renewed two thirds into their lifetime,
// from the same CA: etcd reads certificate files on every handshake, so no member restarts.
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	LeafValidity = 90 * 24 * time.Hour
)

// TLSPart is one part of a cluster's TLS as it is decided: what it is for, the names its
// certificate must cover, and (mode Operator) the data its Secret holds.
type TLSPart struct {
	Part  string
	Usage certs.Usage
	Names []string
	// Data is the Secret's data to apply; nil when Issue is set (act issues it).
	Data map[string][]byte
	// Issue: a certificate is issued (or renewed) for this part; Why says why. Rotate (the CA):
	// a new CA replaces the one in Data, trusted together with it. ByPrevious: issued by the CA
	// being replaced, the only one every member trusts until they all restarted.
	Issue, Rotate, ByPrevious bool
	Why                       string
}

// TLS is what a reconcile does about a cluster's certificates.
type TLS struct {
	// Token is the value of AnnotationRotateCA the CA answers (kept in its Secret).
	Token string
	// Trust identifies the CAs members must trust: while a CA rotation runs (mode Operator), and
	// your Secrets' (mode Secrets); "" otherwise.
	Trust string
	// Parts are the operator's Secrets to apply (mode Operator), the CA first.
	Parts []TLSPart
	// Problem says why the cluster cannot use its certificates; nothing is written then.
	Problem string
}

// tlsParts are the leaf parts and what each certificate is for.
func tlsParts(kvc *kvv1.KVCluster) []TLSPart {
	return []TLSPart{
		{Part: specs.TLSServer, Usage: certs.Server, Names: specs.ServerNames(kvc)},
		{Part: specs.TLSPeer, Usage: certs.Peer, Names: specs.PeerNames(kvc)},
		{Part: specs.TLSClient, Usage: certs.Client, Names: []string{specs.ClientCommonName(kvc)}},
	}
}

// planTLS checks the cluster's certificates: in mode Operator it issues what is missing and
// renews what is due; in mode Secrets it checks the given Secrets fit (the keys, the CA, the
// names every member and client use, the usage, the dates). The CA is never replaced on a
// cluster that formed: members load it once, at start, and a new one would cut them off.
//
// A cluster moving back to plaintext is issued nothing, but its members use their certificates
// until the last roll: without their Secrets, a restarted member would never start. While
// members move either way (back to plaintext: from before its first roll on), they keep the
// Secrets they started the move with.
func planTLS(kvc *kvv1.KVCluster, obs Observation, now time.Time) TLS {
	if t := obs.STSTransport; t != nil && (*t == movingTransport || !specs.TLSEnabled(kvc) && t.UsesTLS()) {
		for _, part := range slices.Sorted(maps.Keys(obs.STSTLSSecrets)) {
			if mounted, named := obs.STSTLSSecrets[part], specs.TLSSecretName(kvc, part); mounted != named {
				return TLS{Problem: fmt.Sprintf("the members are moving between plaintext and TLS with the %s certificate of Secret %s, and the spec now names Secret %s: "+
					"name %s again until the move is done (members given certificates of another CA mid-way would be cut off from each other)", part, mounted, named, mounted)}
			}
		}
	}
	if !specs.TLSEnabled(kvc) {
		if obs.STSTransport == nil || !obs.STSTransport.UsesTLS() {
			return TLS{} // members restarted from now on need no certificates
		}
		for _, p := range tlsParts(kvc) {
			if _, ok := obs.TLS[p.Part]; !ok {
				return TLS{Problem: fmt.Sprintf("the members use TLS until they have moved back to plaintext, and Secret %s (%s certificate) does not exist: "+
					"restore it, or (from mode Secrets) name your Secrets in tls.secrets again until the move is done", specs.TLSSecretName(kvc, p.Part), p.Part)}
			}
		}
		return TLS{}
	}
	if kvc.Spec.TLS.Mode == kvv1.TLSSecrets {
		for _, p := range tlsParts(kvc) {
			if p.Part == specs.TLSClient {
				p.Names = nil // whoever it names, etcd asks only that the cluster's CA issued it
			}
			if why := checkPart(obs.TLS[p.Part], p, now); why != "" {
				return TLS{Problem: fmt.Sprintf("Secret %s (%s certificate) %s", specs.TLSSecretName(kvc, p.Part), p.Part, why)}
			}
		}
		// Members load the CAs they trust at start: when yours change, they restart one at a time.
		trust := append(append([]byte{}, obs.TLS[specs.TLSServer][specs.CACertKey]...), obs.TLS[specs.TLSPeer][specs.CACertKey]...)
		return TLS{Trust: trustID(trust)}
	}
	out := TLS{Token: kvc.Annotations[kvv1.AnnotationRotateCA]}
	ca, hasCA := obs.TLS[specs.TLSCA]
	caErr := certs.CheckCA(ca[corev1.TLSCertKey], ca[corev1.TLSPrivateKeyKey])
	switch {
	case hasCA && caErr == nil:
	case bootstrapped(kvc, obs) && obs.mayUseTLS():
		what := "is missing"
		if hasCA {
			what = "is not a usable CA (" + caErr.Error() + ")"
		}
		return TLS{Problem: fmt.Sprintf("the cluster's CA Secret %s %s, and its members trust only the CA they started with: "+
			"restore the Secret (e.g. from your backup of the namespace's Secrets); a new CA would cut the members off from each other",
			specs.TLSSecretName(kvc, specs.TLSCA), what)}
	default: // a new cluster, or one moving from plaintext to TLS
		out.Parts = append(out.Parts, TLSPart{Part: specs.TLSCA, Issue: true, Why: "the cluster has no CA yet"})
		for _, p := range tlsParts(kvc) {
			p.Issue, p.Why = true, "issued by the new CA"
			out.Parts = append(out.Parts, p)
		}
		return out
	}
	return planRotation(kvc, obs, now, out, ca)
}

// planRotation keeps a formed cluster's certificates issued by its CA, and replaces the CA with
// overlap when asked (AnnotationRotateCA) or when it is two thirds into its life. etcd loads its
// trusted CAs only at start, so a rotation moves in steps, each derived from what is observed:
//  1. a new CA signs from now on; members are told to trust the old and the new one (the CA
//     Secret's ca.crt), which changes their template, and they restart one at a time;
//  2. once every member runs trusting both, the certificates are issued anew by the new CA (etcd
//     reads certificate files on every handshake);
//  3. once every certificate is the new CA's and its volumes had time to update, members trust the
//     new CA only, and restart once more.
//
// A certificate is never issued by a CA some member does not trust yet.
func planRotation(kvc *kvv1.KVCluster, obs Observation, now time.Time, out TLS, ca map[string][]byte) TLS {
	signer, previous := ca[corev1.TLSCertKey], ca[specs.PreviousCAKey]
	trust := ca[specs.CACertKey]
	if len(trust) == 0 {
		trust = signer
	}
	rotating := len(previous) > 0
	notBefore, notAfter, _ := certs.Expiry(signer)
	requested := out.Token != "" && out.Token != string(ca[specs.RotatedForKey])
	if !rotating && (requested || !now.Before(certs.RenewAt(notBefore, notAfter))) {
		why := "the CA is two thirds into its life"
		if requested {
			why = fmt.Sprintf("%s=%s asks for a new CA", kvv1.AnnotationRotateCA, out.Token)
		}
		// Nothing else changes in this reconcile: the next one sees the new CA and what members trust.
		out.Parts = append(out.Parts, TLSPart{Part: specs.TLSCA, Data: ca, Issue: true, Rotate: true, Why: why})
		for _, p := range tlsParts(kvc) {
			p.Data = obs.TLS[p.Part]
			if p.Data == nil { // lost meanwhile: issued by the CA every member trusts
				p.Issue, p.ByPrevious, p.Why = true, true, "missing"
			}
			out.Parts = append(out.Parts, p)
		}
		return out
	}
	if rotating {
		out.Trust = trustID(trust)
	}
	trusted := obs.STSTrust == out.Trust && obs.rolled(kvc)
	// What members trust is in the Secrets they mounted (whichever is left); outside a rotation, no
	// roll to a new trust may be pending either.
	mounted := obs.TLS[specs.TLSPeer][specs.CACertKey]
	if len(mounted) == 0 {
		mounted = obs.TLS[specs.TLSServer][specs.CACertKey]
	}
	signerTrusted := !bootstrapped(kvc, obs) || len(mounted) == 0 || (containsCert(mounted, signer) && (rotating || obs.STSTrust == ""))
	caPart := TLSPart{Part: specs.TLSCA, Data: ca}
	allFromSigner, settled := true, true
	for _, p := range tlsParts(kvc) {
		data, has := obs.TLS[p.Part]
		why := checkPart(withCA(data, signer), p, now)
		switch {
		case !has:
			p.Issue, p.Why = true, "missing"
			p.ByPrevious = rotating && !trusted
		case rotating && !trusted && why != "":
			// Still the old CA's, which every member trusts; the new one's waits until they all do.
			allFromSigner = false
			notBefore, notAfter, _ := certs.Expiry(data[corev1.TLSCertKey])
			if old := checkPart(data, p, now); old != "" {
				p.Issue, p.ByPrevious, p.Why = true, true, old
			} else if !now.Before(certs.RenewAt(notBefore, notAfter)) {
				p.Issue, p.ByPrevious, p.Why = true, true, "due for renewal while the CA is rotated"
			}
		case why == "":
			notBefore, notAfter, _ := certs.Expiry(data[corev1.TLSCertKey])
			if !now.Before(certs.RenewAt(notBefore, notAfter)) {
				p.Issue, p.Why = true, fmt.Sprintf("due for renewal (it expires %s)", notAfter.UTC().Format(time.RFC3339))
			} else if now.Before(notBefore.Add(certs.ClockSkew + volumeUpdate)) {
				settled = false // members may still read the one before from their volumes
			}
		case rotating:
			p.Issue, p.Why = true, "the CA is being rotated: every member trusts the new one"
		default:
			p.Issue, p.Why = true, why
		}
		if p.Issue && !p.ByPrevious && !signerTrusted {
			// Members would reject what the signer issues (the CA Secret was replaced or lost its
			// rotation state): keep what they trust while it lasts, and say what to do.
			if has && checkPart(data, p, now) == "" {
				p.Issue, p.Why = false, ""
			} else {
				return TLS{Problem: fmt.Sprintf("the %s certificate must be issued anew, but the CA in Secret %s is not one the members trust "+
					"(was the Secret replaced, or a CA rotation's old CA removed from it?): restore the CA the members started with",
					p.Part, specs.TLSSecretName(kvc, specs.TLSCA))}
			}
		}
		if !p.Issue {
			p.Data = withCA(data, trust)
		}
		allFromSigner = allFromSigner && !p.Issue
		out.Parts = append(out.Parts, p)
	}
	if rotating && allFromSigner && settled && trusted {
		// Every certificate is the new CA's: members trust it alone from now on.
		caPart.Data = map[string][]byte{corev1.TLSCertKey: signer, corev1.TLSPrivateKeyKey: ca[corev1.TLSPrivateKeyKey],
			specs.CACertKey: signer, specs.RotatedForKey: ca[specs.RotatedForKey]}
		caPart.Why = "every certificate is the new CA's"
	}
	out.Parts = append([]TLSPart{caPart}, out.Parts...)
	return out
}

// volumeUpdate is how long a renewed certificate may take to reach the members' Secret volumes.
const volumeUpdate = 3 * time.Minute

// withCA is a Secret's data with ca.crt set to trust.
func withCA(data map[string][]byte, trust []byte) map[string][]byte {
	if data == nil {
		return nil
	}
	out := make(map[string][]byte, len(data))
	for k, v := range data {
		out[k] = v
	}
	out[specs.CACertKey] = trust
	return out
}

// trustID names a CA bundle in the members' template.
func trustID(bundle []byte) string {
	sum := sha256.Sum256(bundle)
	return hex.EncodeToString(sum[:8])
}

// checkPart says why a Secret's certificate does not fit p, or "".
func checkPart(data map[string][]byte, p TLSPart, now time.Time) string {
	if data == nil {
		return "does not exist"
	}
	for _, key := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, specs.CACertKey} {
		if len(data[key]) == 0 {
			return "has no " + key
		}
	}
	if err := certs.Check(data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey], data[specs.CACertKey], p.Usage, p.Names, now); err != nil {
		return "does not fit: " + err.Error()
	}
	return ""
}

// NextRenewal is when the earliest of the cluster's certificates is due for renewal; zero when
// none is known.
func (t TLS) NextRenewal(now time.Time) time.Time {
	var next time.Time
	for _, p := range t.Parts {
		if p.Part == specs.TLSCA || p.Data == nil {
			continue
		}
		notBefore, notAfter, err := certs.Expiry(p.Data[corev1.TLSCertKey])
		if err != nil {
			continue
		}
		// One past due and kept (waiting on a rotation) is looked at again with the next poll.
		if at := certs.RenewAt(notBefore, notAfter); at.After(now) && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return next
}

// containsCert: the PEM bundle holds the PEM certificate cert.
func containsCert(bundle, cert []byte) bool {
	return len(cert) > 0 && bytes.Contains(bundle, bytes.TrimSpace(cert))
}

// certificateStatuses are the expiry dates of the certificates the cluster's Secrets hold now
// (one issued in this reconcile shows in the next), and when the operator renews its own.
func certificateStatuses(kvc *kvv1.KVCluster, obs Observation) []kvv1.CertificateStatus {
	if !specs.TLSEnabled(kvc) {
		return nil
	}
	var out []kvv1.CertificateStatus
	for _, part := range []string{specs.TLSCA, specs.TLSServer, specs.TLSPeer, specs.TLSClient} {
		data, ok := obs.TLS[part]
		if !ok {
			continue
		}
		notBefore, notAfter, err := certs.Expiry(data[corev1.TLSCertKey])
		if err != nil {
			continue
		}
		cs := kvv1.CertificateStatus{Name: part, Secret: specs.TLSSecretName(kvc, part), NotAfter: metav1.NewTime(notAfter)}
		if kvc.Spec.TLS.Mode == kvv1.TLSOperator && part != specs.TLSCA {
			renew := metav1.NewTime(certs.RenewAt(notBefore, notAfter))
			cs.RenewAt = &renew
		}
		out = append(out, cs)
	}
	return out
}
