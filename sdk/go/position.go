package jetgate

// Where the device is in its mailbox: the token it resumes with and the last applied seq, and,
// after a split, the stages still ahead. A port of client/position.ts, pure: the client feeds it
// what arrives, in order with the entries, and does what it answers (save the cursor, or clear it).
//
// Stored-cursor rule: token and seq always share one numbering. During a split the device moves
// to a stage's numbering only when that stage's entries begin, never straight to the last one
// (that would drop C1's entries as regressions), and takes the stage's token at the same time (a
// child token with a parent seq makes a gateway skip the child's first entries).

// stage is one numbering the device passes through after a split: an old shard's range, or the
// new shard. Entering it: last applied = max(last applied, after), token = cursor if known.
type stage struct {
	shard  uint32
	after  uint64
	cursor *Token
}

// split is a split in progress: old shards' ranges (one per hop), then the new shard.
type split struct {
	// current is the range the device is in; nil before the first one's entries began.
	current *stage
	// ahead are the ranges not entered yet, in order.
	ahead []*stage
	// target is the new shard (replay_from_seq, new_cursor): entering it ends the split.
	target *stage
}

// posAction is what the client must do after a position change: save cursor, or clear the store.
type posAction struct {
	clear  bool
	cursor Cursor
}

type position struct {
	token *Token
	seq   uint64
	split *split
}

// cursor is the cursor to AUTH with (where applying stopped), nil without a token.
func (p *position) cursor() *Cursor {
	if p.token == nil {
		return nil
	}
	return &Cursor{Token: *p.token, Seq: p.seq}
}

// load takes the cursor the store kept from an earlier run; it saves nothing.
func (p *position) load(c Cursor) {
	t := c.Token
	p.token = &t
	p.seq = c.Seq
}

// authOK takes AUTH_OK: from is the server's position for this device.
func (p *position) authOK(tok Token, from uint64) []posAction {
	if p.split != nil {
		// the old ranges play first: AUTH_OK's token is the new shard's, taken when its entries begin
		p.split.target.cursor = &tok
	} else {
		p.token = &tok
		p.seq = from
	}
	return p.save()
}

// rebased takes CURSOR_REBASED: to and tok are the new shard's, ranges the split's hops if any.
func (p *position) rebased(to uint64, tok Token, ranges []OldRange) []posAction {
	stages := make([]*stage, 0, len(ranges)+1)
	for _, o := range ranges {
		stages = append(stages, &stage{shard: o.Shard, after: o.After, cursor: o.Cursor})
	}
	stages = append(stages, &stage{shard: tok.Shard, after: to, cursor: &tok})
	switch sp := p.split; {
	case sp != nil:
		// Another rebase before the last one's new shard began: its stages follow the ones still
		// ahead. Its first stage is usually that same new shard: one stage then, which keeps the
		// earlier token when this frame names none.
		target := sp.target
		if stages[0].shard == target.shard {
			first := stages[0]
			stages = stages[1:]
			if first.after > target.after {
				target.after = first.after
			}
			if first.cursor != nil {
				target.cursor = first.cursor
			}
		}
		if len(stages) > 0 {
			last := stages[len(stages)-1]
			sp.ahead = append(append(sp.ahead, target), stages[:len(stages)-1]...)
			sp.target = last
		}
	case len(stages) > 1:
		// The old shards' ranges come first (their seqs are below the new shard's), each in its
		// own numbering, entered as its entries begin.
		p.split = &split{ahead: stages[:len(stages)-1], target: stages[len(stages)-1]}
	default:
		p.enter(stages[0])
	}
	return p.save()
}

// entries: a MSGS frame of shard is about to be applied.
func (p *position) entries(shard uint32) []posAction {
	if p.split == nil {
		return nil
	}
	return p.arrival(&shard)
}

// synced: SYNCED, every range and the new shard's catch-up were sent.
func (p *position) synced() []posAction {
	if p.split == nil {
		return nil
	}
	return p.arrival(nil)
}

// applied: the app's handler finished seq (or it was a duplicate).
func (p *position) applied(seq uint64) []posAction {
	p.seq = seq
	return p.save()
}

// expired: CURSOR_EXPIRED, a rebuild; AUTH_OK's from (the head) follows.
func (p *position) expired(tok Token) []posAction {
	p.token = &tok
	p.seq = 0
	return nil
}

// invalid: CURSOR_INVALID, a fresh start.
func (p *position) invalid(tok *Token) []posAction {
	p.token = tok
	p.seq = 0
	return []posAction{{clear: true}}
}

// connectionLost: what the dead connection delivered comes again after the cursor; so does any
// split.
func (p *position) connectionLost() {
	p.split = nil
}

// arrival: entries of shard (nil: SYNCED) arrive during a split. Entries of a later stage's shard
// enter that stage, passing over the ranges before it that had no entries; SYNCED goes on to the
// new shard. Entries of the stage the device is in, or of a shard no stage ahead names, change
// nothing.
func (p *position) arrival(shard *uint32) []posAction {
	sp := p.split
	if shard != nil {
		if sp.current != nil && sp.current.shard == *shard {
			return nil
		}
		for i, s := range sp.ahead {
			if s.shard == *shard {
				sp.current = s
				sp.ahead = sp.ahead[i+1:]
				p.enter(s)
				return p.save()
			}
		}
		if sp.target.shard != *shard {
			return nil
		}
	}
	p.split = nil
	p.enter(sp.target)
	return p.save()
}

// enter moves to a stage's numbering: never below the last applied; its token when it has one.
func (p *position) enter(s *stage) {
	if s.after > p.seq {
		p.seq = s.after
	}
	if s.cursor != nil {
		p.token = s.cursor
	}
}

func (p *position) save() []posAction {
	c := p.cursor()
	if c == nil {
		return nil
	}
	return []posAction{{cursor: *c}}
}
