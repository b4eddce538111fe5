package jetgate

// recentIDs are the message ids a device applied most recently: the last line of dedup after a
// rebase replays entries it already has (client/dedup.ts). Bounded: past capacity the oldest id
// is forgotten, and a duplicate older than the window reaches the handler again (which must be
// idempotent anyway: a crash between the handler and the cursor save replays an entry).
type recentIDs struct {
	capacity int
	ids      map[string]struct{}
	// order holds the ids in the order added, as a ring once full.
	order []string
	next  int
}

func newRecentIDs(capacity int) *recentIDs {
	if capacity < 1 {
		capacity = 1
	}
	return &recentIDs{capacity: capacity, ids: make(map[string]struct{})}
}

func (r *recentIDs) has(id string) bool {
	_, ok := r.ids[id]
	return ok
}

func (r *recentIDs) add(id string) {
	if r.has(id) {
		return
	}
	r.ids[id] = struct{}{}
	if len(r.order) < r.capacity {
		r.order = append(r.order, id)
		return
	}
	delete(r.ids, r.order[r.next])
	r.order[r.next] = id
	r.next = (r.next + 1) % r.capacity
}

func (r *recentIDs) len() int { return len(r.ids) }
