package jetgate

// The position as a table, ported case by case from test/unit/client-position.test.ts: inputs
// (what arrives, in order with the entries) -> token, last applied seq, split stages, and what
// the client must do (save the cursor, clear it).

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

var posSig = []byte{3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3}

func ptok(shard uint32, epoch uint16, log string) Token {
	return Token{Shard: shard, Epoch: epoch, Log: log, Sig: posSig}
}

// S is a seq by offset and epoch, as the TS test writes it. Each shard has its own epoch (a child
// starts at its parent's epoch + 1), so a token and a seq of different numberings show.
func S(offset, epoch uint64) uint64 { return composeSeq(epoch, offset) }

var (
	tP  = ptok(1, 1, "L")
	tC1 = ptok(2, 2, "L")
	tC2 = ptok(3, 3, "L")
	tC3 = ptok(4, 4, "L")
)

var named = []struct {
	name string
	tok  Token
}{{"P", tP}, {"C1", tC1}, {"C2", tC2}, {"C3", tC3}, {"P'", ptok(1, 2, "L")}, {"C1'", ptok(2, 2, "L2")}, {"C1@5", ptok(2, 5, "L")}}

func T(name string) Token {
	for _, n := range named {
		if n.name == name {
			return n.tok
		}
	}
	panic(name)
}

func nameOf(t *Token) string {
	if t == nil {
		return "-"
	}
	for _, n := range named {
		if n.tok.Shard == t.Shard && n.tok.Epoch == t.Epoch && n.tok.Log == t.Log {
			return n.name
		}
	}
	return "?"
}

func seqText(seq uint64) string { return fmt.Sprintf("%d:%d", seq>>48, seq&(1<<48-1)) }

type posStep struct {
	name string
	do   func(p *position) []posAction
}

func auth(tok Token, from uint64) posStep {
	return posStep{"auth_ok", func(p *position) []posAction { return p.authOK(tok, from) }}
}

func rng(tok Token, after uint64, withCursor bool) OldRange {
	r := OldRange{Shard: tok.Shard, After: after, Until: after + 10}
	if withCursor {
		c := tok
		r.Cursor = &c
	}
	return r
}

func rebased(tok Token, to uint64, ranges ...OldRange) posStep {
	return posStep{"rebased", func(p *position) []posAction { return p.rebased(to, tok, ranges) }}
}

func entries(shard uint32) posStep {
	return posStep{"entries", func(p *position) []posAction { return p.entries(shard) }}
}

var synced = posStep{"synced", func(p *position) []posAction { return p.synced() }}

func applied(seq uint64) posStep {
	return posStep{"applied", func(p *position) []posAction { return p.applied(seq) }}
}

var lost = posStep{"connection_lost", func(p *position) []posAction { p.connectionLost(); return nil }}

func expired(tok Token) posStep {
	return posStep{"expired", func(p *position) []posAction { return p.expired(tok) }}
}

func invalid(tok *Token) posStep {
	return posStep{"invalid", func(p *position) []posAction { return p.invalid(tok) }}
}

type splitWant struct {
	in    string // "" when not in a range yet
	ahead []string
	to    string
}

type want struct {
	at      string // token name and last applied seq as epoch:offset
	actions []string
	split   *splitWant
}

func sp(in string, ahead []string, to string) *splitWant {
	if ahead == nil {
		ahead = []string{}
	}
	return &splitWant{in: in, ahead: ahead, to: to}
}

func acts(a ...string) []string { return a }

func actionText(a posAction) string {
	if a.clear {
		return "clear"
	}
	return fmt.Sprintf("save %s %s", nameOf(&a.cursor.Token), seqText(a.cursor.Seq))
}

type posCase struct {
	name   string
	stored *Cursor
	steps  []struct {
		in posStep
		w  want
	}
}

func stored(tok Token, seq uint64) *Cursor { return &Cursor{Token: tok, Seq: seq} }

type step = struct {
	in posStep
	w  want
}

var positionCases = []posCase{
	{name: "AUTH_OK without a split: its cursor and from, saved; each applied entry saved", steps: []step{
		{auth(tP, S(0, 1)), want{at: "P 1:0", actions: acts("save P 1:0")}},
		{applied(S(1, 1)), want{at: "P 1:1", actions: acts("save P 1:1")}},
	}},
	{name: "no token yet: applied moves the seq, nothing to save", steps: []step{
		{applied(S(3, 1)), want{at: "- 1:3"}},
	}},
	{name: "a rebase without ranges (epoch change): the new cursor at once, never below the last applied", stored: stored(tP, S(9, 1)), steps: []step{
		{rebased(T("P'"), S(4, 1)), want{at: "P' 1:9", actions: acts("save P' 1:9")}},
		{rebased(T("P'"), S(2, 2)), want{at: "P' 2:2", actions: acts("save P' 2:2")}},
	}},
	{name: "one hop (P -> C1): P's range when its entries begin, then C1 with AUTH_OK's token", stored: stored(tP, S(10, 1)), steps: []step{
		{rebased(tC1, S(0, 2), rng(tP, S(10, 1), true)), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("", acts("P"), "C1")}},
		{auth(T("C1'"), S(0, 2)), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("", acts("P"), "C1'")}},
		{entries(1), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("P", nil, "C1'")}},
		{applied(S(15, 1)), want{at: "P 1:15", actions: acts("save P 1:15"), split: sp("P", nil, "C1'")}},
		{entries(1), want{at: "P 1:15", split: sp("P", nil, "C1'")}},
		{entries(2), want{at: "C1' 2:0", actions: acts("save C1' 2:0")}},
	}},
	{name: "two hops: each range in its own numbering, then the new shard, never straight to the last", stored: stored(tP, S(10, 1)), steps: []step{
		{rebased(tC2, S(0, 3), rng(tP, S(10, 1), true), rng(tC1, S(0, 2), true)), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("", acts("P", "C1"), "C2")}},
		{entries(1), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("P", acts("C1"), "C2")}},
		{applied(S(20, 1)), want{at: "P 1:20", actions: acts("save P 1:20"), split: sp("P", acts("C1"), "C2")}},
		{entries(2), want{at: "C1 2:0", actions: acts("save C1 2:0"), split: sp("C1", nil, "C2")}},
		{applied(S(5, 2)), want{at: "C1 2:5", actions: acts("save C1 2:5"), split: sp("C1", nil, "C2")}},
		{entries(3), want{at: "C2 3:0", actions: acts("save C2 3:0")}},
	}},
	{name: "three hops: a range with no entries is passed over when a later one's entries begin", stored: stored(tP, S(3, 1)), steps: []step{
		{rebased(tC3, S(0, 4), rng(tP, S(3, 1), true), rng(tC1, S(0, 2), true), rng(tC2, S(0, 3), true)), want{at: "P 1:3", actions: acts("save P 1:3"), split: sp("", acts("P", "C1", "C2"), "C3")}},
		{entries(2), want{at: "C1 2:0", actions: acts("save C1 2:0"), split: sp("C1", acts("C2"), "C3")}},
		{entries(4), want{at: "C3 4:0", actions: acts("save C3 4:0")}},
	}},
	{name: "the new shard with no entries: SYNCED enters it after the last range", stored: stored(tP, S(10, 1)), steps: []step{
		{rebased(tC2, S(0, 3), rng(tP, S(10, 1), true), rng(tC1, S(0, 2), true)), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("", acts("P", "C1"), "C2")}},
		{entries(2), want{at: "C1 2:0", actions: acts("save C1 2:0"), split: sp("C1", nil, "C2")}},
		{synced, want{at: "C2 3:0", actions: acts("save C2 3:0")}},
	}},
	{name: "SYNCED before any range's entries: everything was sent, on to the new shard", stored: stored(tP, S(10, 1)), steps: []step{
		{rebased(tC1, S(0, 2), rng(tP, S(10, 1), true)), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("", acts("P"), "C1")}},
		{synced, want{at: "C1 2:0", actions: acts("save C1 2:0")}},
	}},
	{name: "entries of a shard no stage ahead names (or of a range already passed) change nothing", stored: stored(tP, S(10, 1)), steps: []step{
		{rebased(tC2, S(0, 3), rng(tP, S(10, 1), true), rng(tC1, S(0, 2), true)), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("", acts("P", "C1"), "C2")}},
		{entries(9), want{at: "P 1:10", split: sp("", acts("P", "C1"), "C2")}},
		{entries(2), want{at: "C1 2:0", actions: acts("save C1 2:0"), split: sp("C1", nil, "C2")}},
		{entries(1), want{at: "C1 2:0", split: sp("C1", nil, "C2")}},
	}},
	{name: "a range without its own token (an older gateway): the token the device had stays, with the range's seq", stored: stored(tP, S(10, 1)), steps: []step{
		{rebased(tC1, S(0, 2), rng(tP, S(12, 1), false)), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("", acts("-"), "C1")}},
		{entries(1), want{at: "P 1:12", actions: acts("save P 1:12"), split: sp("-", nil, "C1")}},
		{entries(2), want{at: "C1 2:0", actions: acts("save C1 2:0")}},
	}},
	{name: "a second rebase before the new shard began, naming that shard first: one stage, the earlier token kept", steps: []step{
		{auth(tP, S(1, 1)), want{at: "P 1:1", actions: acts("save P 1:1")}},
		{rebased(tC1, S(0, 2), rng(tP, S(1, 1), true)), want{at: "P 1:1", actions: acts("save P 1:1"), split: sp("", acts("P"), "C1")}},
		{entries(1), want{at: "P 1:1", actions: acts("save P 1:1"), split: sp("P", nil, "C1")}},
		{applied(S(2, 1)), want{at: "P 1:2", actions: acts("save P 1:2"), split: sp("P", nil, "C1")}},
		{rebased(tC2, S(0, 3), rng(tC1, S(0, 2), false)), want{at: "P 1:2", actions: acts("save P 1:2"), split: sp("P", acts("C1"), "C2")}},
		{entries(2), want{at: "C1 2:0", actions: acts("save C1 2:0"), split: sp("C1", nil, "C2")}},
		{applied(S(2, 2)), want{at: "C1 2:2", actions: acts("save C1 2:2"), split: sp("C1", nil, "C2")}},
		{entries(3), want{at: "C2 3:0", actions: acts("save C2 3:0")}},
	}},
	{name: "a second rebase naming the new shard first: its later after and its token win", steps: []step{
		{auth(tP, S(1, 1)), want{at: "P 1:1", actions: acts("save P 1:1")}},
		{rebased(tC1, S(0, 2), rng(tP, S(1, 1), true)), want{at: "P 1:1", actions: acts("save P 1:1"), split: sp("", acts("P"), "C1")}},
		{rebased(tC2, S(0, 3), rng(T("C1'"), S(1, 2), true)), want{at: "P 1:1", actions: acts("save P 1:1"), split: sp("", acts("P", "C1'"), "C2")}},
		{entries(2), want{at: "C1' 2:1", actions: acts("save C1' 2:1"), split: sp("C1'", nil, "C2")}},
	}},
	{name: "a second rebase whose first range is another shard: all its stages follow the ones ahead", stored: stored(tP, S(10, 1)), steps: []step{
		{rebased(tC1, S(0, 2), rng(tP, S(10, 1), true)), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("", acts("P"), "C1")}},
		{rebased(tC3, S(0, 4), rng(tC2, S(0, 3), true)), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("", acts("P", "C1", "C2"), "C3")}},
		{entries(3), want{at: "C2 3:0", actions: acts("save C2 3:0"), split: sp("C2", nil, "C3")}},
	}},
	{name: "a second rebase without ranges for the same new shard (its epoch changed): the new shard moves, no stage added", stored: stored(tP, S(10, 1)), steps: []step{
		{rebased(tC1, S(0, 2), rng(tP, S(10, 1), true)), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("", acts("P"), "C1")}},
		{rebased(T("C1@5"), S(0, 5)), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("", acts("P"), "C1@5")}},
		{entries(2), want{at: "C1@5 5:0", actions: acts("save C1@5 5:0")}},
	}},
	{name: "the connection lost inside a range: the split ends where it was; the cursor stays in that range's numbering", stored: stored(tP, S(10, 1)), steps: []step{
		{rebased(tC2, S(0, 3), rng(tP, S(10, 1), true), rng(tC1, S(0, 2), true)), want{at: "P 1:10", actions: acts("save P 1:10"), split: sp("", acts("P", "C1"), "C2")}},
		{entries(2), want{at: "C1 2:0", actions: acts("save C1 2:0"), split: sp("C1", nil, "C2")}},
		{applied(S(2, 2)), want{at: "C1 2:2", actions: acts("save C1 2:2"), split: sp("C1", nil, "C2")}},
		{lost, want{at: "C1 2:2"}},
		{entries(3), want{at: "C1 2:2"}},
		{synced, want{at: "C1 2:2"}},
	}},
	{name: "CURSOR_EXPIRED: the new token and seq 0, nothing saved until AUTH_OK's head", stored: stored(tP, S(5, 1)), steps: []step{
		{expired(tP), want{at: "P 0:0"}},
		{auth(tP, S(60, 1)), want{at: "P 1:60", actions: acts("save P 1:60")}},
	}},
	{name: "CURSOR_INVALID: the store is cleared and the device starts fresh", stored: stored(tP, S(9, 1)), steps: []step{
		{invalid(&tP), want{at: "P 0:0", actions: acts("clear")}},
		{invalid(nil), want{at: "- 0:0", actions: acts("clear")}},
		{applied(S(1, 1)), want{at: "- 1:1"}},
	}},
	{name: "entries and SYNCED outside a split change nothing", steps: []step{
		{auth(tP, S(3, 1)), want{at: "P 1:3", actions: acts("save P 1:3")}},
		{entries(7), want{at: "P 1:3"}},
		{synced, want{at: "P 1:3"}},
	}},
}

func TestPosition(t *testing.T) {
	for _, c := range positionCases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			var p position
			if c.stored != nil {
				p.load(*c.stored)
			}
			for i, s := range c.steps {
				var got want
				for _, a := range s.in.do(&p) {
					got.actions = append(got.actions, actionText(a))
				}
				got.at = nameOf(p.token) + " " + seqText(p.seq)
				if p.split != nil {
					g := &splitWant{ahead: []string{}, to: nameOf(p.split.target.cursor)}
					if p.split.current != nil {
						g.in = nameOf(p.split.current.cursor)
					}
					for _, a := range p.split.ahead {
						g.ahead = append(g.ahead, nameOf(a.cursor))
					}
					got.split = g
				}
				if !reflect.DeepEqual(got, s.w) {
					t.Fatalf("step %d (%s):\n got %+v %+v\nwant %+v %+v", i+1, s.in.name, got, got.split, s.w, s.w.split)
				}
			}
		})
	}
}

func TestPositionCursor(t *testing.T) {
	var p position
	if p.cursor() != nil {
		t.Fatal("a cursor without a token")
	}
	p.applied(S(4, 1))
	if p.cursor() != nil {
		t.Fatal("a cursor without a token after applied")
	}
	p.load(Cursor{Token: tC1, Seq: S(7, 2)})
	if got := p.cursor(); got == nil || !reflect.DeepEqual(*got, Cursor{Token: tC1, Seq: S(7, 2)}) {
		t.Fatalf("cursor %+v", got)
	}
}
