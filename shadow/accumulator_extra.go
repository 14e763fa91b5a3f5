package shadow

// ReplicaSimilarity is the noise-floor sample of a replica answer (the same request sent
// to the primary cluster a second time): RougeL of the replica's rendered answer against
// the primary's, as Accumulator.AddReplica computes it. ok is false when either side
// failed (such pairs are not part of the noise floor).
func ReplicaSimilarity(primary, replica Answer) (s float64, ok bool) {
	if !primary.OK() || !replica.OK() {
		return 0, false
	}
	return RougeL(render(replica), render(primary)), true
}

// AddReplicaSimilarity records one noise-floor sample computed earlier (by
// ReplicaSimilarity, or read back from a Store), as AddReplica would have.
func (a *Accumulator) AddReplicaSimilarity(s float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.replicas++
	a.noise.add(s)
}
