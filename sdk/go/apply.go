package jetgate

// The apply loop (client/apply-loop.ts): what arrives goes through one queue in arrival order,
// and entries reach the app's handler one at a time. Rebases, AUTH_OK, SYNCED and the cursor
// errors are queued with the entries, so a mid-session rebase never moves the cursor past
// entries still waiting to be applied, and a rebuild runs before any entry after it.

import (
	"context"
	"time"
)

type itemKind int

const (
	itemEntries itemKind = iota
	itemAuthOK
	itemRebased
	itemSynced
	itemExpired
	itemInvalid
)

// item is one thing to apply, with the session that delivered it.
type item struct {
	kind itemKind
	sess *session
	// entries: the MSGS frame's shard and entries
	shard   uint32
	entries []Entry
	// auth_ok: cursor and from; rebased: new_cursor and replay_from_seq; expired: new_cursor and
	// the trim watermark
	token  Token
	seq    uint64
	ranges []OldRange
	// invalid: new_cursor (may be nil) and the message
	newToken *Token
	reason   string
}

// push queues it after everything before it.
func (c *Client) push(it item) {
	c.mu.Lock()
	c.queue = append(c.queue, it)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// waitApplyIdle waits until no item is in the applier's hands; false when the client ended.
func (c *Client) waitApplyIdle() bool {
	for {
		c.mu.Lock()
		if c.idle {
			c.mu.Unlock()
			return true
		}
		ch := c.idleCh
		c.mu.Unlock()
		select {
		case <-ch:
		case <-c.ctx.Done():
			return false
		}
	}
}

// waitApplyIdleFor is waitApplyIdle for a closing client: at most d.
func (c *Client) waitApplyIdleFor(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	c.mu.Lock()
	ch := c.idleCh
	c.mu.Unlock()
	select {
	case <-ch:
	case <-t.C:
	}
}

func (c *Client) markIdleLocked() {
	if !c.idle {
		c.idle = true
		close(c.idleCh)
	}
}

// applyLoop is the applier goroutine: it takes items one by one until the client ends.
func (c *Client) applyLoop() {
	defer c.wg.Done()
	defer func() {
		c.mu.Lock()
		c.markIdleLocked()
		c.mu.Unlock()
	}()
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.markIdleLocked()
			c.mu.Unlock()
			select {
			case <-c.wake:
				continue
			case <-c.ctx.Done():
				return
			}
		}
		it := c.queue[0]
		c.queue[0] = item{}
		c.queue = c.queue[1:]
		if c.idle {
			c.idle = false
			c.idleCh = make(chan struct{})
		}
		c.mu.Unlock()
		if c.ctx.Err() != nil {
			return
		}
		// what a dead connection delivered comes again after the cursor
		if !it.sess.isDone() {
			c.take(it)
		}
	}
}

func (c *Client) take(it item) {
	switch it.kind {
	case itemAuthOK:
		c.mu.Lock()
		acts := c.pos.authOK(it.token, it.seq)
		c.mu.Unlock()
		c.perform(acts)
	case itemRebased:
		c.mu.Lock()
		c.stats.Rebases++
		acts := c.pos.rebased(it.seq, it.token, it.ranges)
		c.mu.Unlock()
		c.perform(acts)
		tok := it.token
		c.emit(Event{Type: EventRebased, Seq: it.seq, Token: &tok})
	case itemSynced:
		c.mu.Lock()
		acts := c.pos.synced()
		c.mu.Unlock()
		c.perform(acts)
		c.syncedDone(it.sess)
	case itemExpired:
		// entries after it wait until the app rebuilt; AUTH_OK's from (the head) follows
		if !c.rebuild(it.seq) {
			return
		}
		c.mu.Lock()
		acts := c.pos.expired(it.token)
		c.mu.Unlock()
		c.perform(acts)
	case itemInvalid:
		c.mu.Lock()
		c.stats.CursorInvalid++
		acts := c.pos.invalid(it.newToken)
		c.mu.Unlock()
		c.perform(acts)
		c.emit(Event{Type: EventCursorInvalid, Reason: it.reason})
	case itemEntries:
		c.mu.Lock()
		acts := c.pos.entries(it.shard)
		c.mu.Unlock()
		c.perform(acts)
		for _, e := range it.entries {
			// a gap that could not be filled, or the connection went: the rest comes again
			if !c.applyOne(it.sess, e) {
				return
			}
		}
	}
}

// syncedDone: catch-up is over; the session is live and the backoff starts over.
func (c *Client) syncedDone(s *session) {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	c.mu.Lock()
	if c.sess != s || c.state.Type != StateSyncing {
		c.mu.Unlock()
		return
	}
	c.reco.reset()
	c.state = State{Type: StateLive}
	seq := c.pos.seq
	c.mu.Unlock()
	c.callOnEvent(Event{Type: EventState, State: State{Type: StateLive}})
	c.callOnEvent(Event{Type: EventSynced, Seq: seq})
}

// rebuild runs the app's rebuild hook until it succeeds; false when the client closed first. A
// hook that fails is told and run again after the handler's backoff: applying later entries over
// a state that was not rebuilt would be wrong. The connection is not made again meanwhile (what
// it would bring could not be applied).
func (c *Client) rebuild(trim uint64) bool {
	for attempt := 0; ; attempt++ {
		if c.ctx.Err() != nil {
			return false
		}
		var err error
		if c.opts.OnRebuild != nil {
			err = c.opts.OnRebuild(c.ctx, trim)
		}
		if err == nil {
			return true
		}
		c.mu.Lock()
		c.stats.HandlerErrors++
		c.mu.Unlock()
		c.emit(Event{Type: EventRebuildError, Err: err})
		if !c.wait(c.tune.handlerBackoff.Delay(attempt, c.tune.random()), nil) {
			return false
		}
	}
}

// applyOne applies e; false when e must wait for the next session (the connection went, or its
// gap could not be filled).
func (c *Client) applyOne(s *session, e Entry) bool {
	if s.isDone() {
		return false
	}
	c.mu.Lock()
	last := c.pos.seq
	if e.Seq <= last {
		c.stats.MailboxSeqRegressionCount++
		c.mu.Unlock()
		return true
	}
	c.mu.Unlock()
	if e.Prev != nil && *e.Prev > last && !c.fillGap(s, e) {
		return false
	}
	if c.recent.has(e.ID) {
		c.mu.Lock()
		c.stats.DuplicatesDropped++
		c.mu.Unlock()
		c.advance(s, e.Seq)
		return true
	}
	for attempt := 0; ; attempt++ {
		if c.ctx.Err() != nil {
			return false
		}
		err := c.opts.OnEntry(c.ctx, e)
		if err == nil {
			break
		}
		c.mu.Lock()
		c.stats.HandlerErrors++
		c.mu.Unlock()
		entry := e
		c.emit(Event{Type: EventHandlerError, Entry: &entry, Err: err})
		// the same entry after the backoff; if the connection goes meanwhile, the next session
		// brings it again after the cursor, which has not moved
		if !c.wait(c.tune.handlerBackoff.Delay(attempt, c.tune.random()), s.done) {
			return false
		}
	}
	c.recent.add(e.ID)
	c.mu.Lock()
	c.stats.Applied++
	c.mu.Unlock()
	c.advance(s, e.Seq)
	return true
}

// fillGap PULLs the entries between the last applied and e and applies them first; false when the
// connection went before the answer: e must not be applied over the gap.
func (c *Client) fillGap(s *session, e Entry) bool {
	c.mu.Lock()
	c.stats.GapsFilled++
	c.mu.Unlock()
	for range c.tune.maxGapRounds {
		reply, ok := s.pull(c.CursorSeq())
		if !ok {
			return false
		}
		last := c.CursorSeq()
		n := 0
		reached := false
		for _, x := range reply.entries {
			if x.Seq >= e.Seq {
				reached = true
			}
			if x.Seq >= e.Seq || x.Seq <= last {
				continue
			}
			n++
			x.Prev = nil
			if !c.applyOne(s, x) {
				return false
			}
		}
		if n == 0 || !reply.more || reached {
			return true
		}
	}
	return true
}

// advance moves the cursor to seq (saved before anything else happens) and counts towards the
// next ACK.
func (c *Client) advance(s *session, seq uint64) {
	s.progressed.Store(true)
	c.mu.Lock()
	acts := c.pos.applied(seq)
	c.mu.Unlock()
	c.perform(acts)
	s.count()
}

// perform does what the position answered, in order. Saves run on a context that Close does not
// cancel: the entry they follow was applied, and its cursor must not be lost to a shutdown.
func (c *Client) perform(acts []posAction) {
	ctx := context.WithoutCancel(c.ctx)
	for _, a := range acts {
		if a.clear {
			if err := c.opts.Store.Clear(ctx); err != nil {
				c.emit(Event{Type: EventStoreError, Err: err})
			} else {
				c.emit(Event{Type: EventCursorCleared})
			}
			continue
		}
		if err := c.opts.Store.Save(ctx, a.cursor); err != nil {
			c.emit(Event{Type: EventStoreError, Err: err})
			continue
		}
		tok := a.cursor.Token
		c.emit(Event{Type: EventCursorSaved, Seq: a.cursor.Seq, Token: &tok})
	}
}
