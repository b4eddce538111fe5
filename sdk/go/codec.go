package jetgate

// The frame codec (protocol/codec.ts, docs/protocol.md "Encoding"): one msgpack map per binary
// WebSocket frame. Device frames are written key by key, in the order client/client.ts builds
// them, with every u64 as an unsigned int of the smallest width (Encoder.EncodeUint). Gateway
// frames are decoded leniently: unknown keys are dropped, known ones are checked as
// protocol/frames.ts's zod schemas check them.

import (
	"bytes"
	"fmt"
	"math"
	"regexp"

	"github.com/vmihailenco/msgpack/v5"
)

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

const (
	maxIDLength   = 64
	maxLaneLength = 32
	// maxSafeInteger is Number.MAX_SAFE_INTEGER: the TS decoder's bound for numbers that are
	// not u64 (timestamps, retry_ms, hb).
	maxSafeInteger = 1<<53 - 1
	maxOldRanges   = 64
)

// validID reports whether s is a safe id of at most max characters (protocol/ids.ts).
func validID(s string, max int) bool {
	return len(s) >= 1 && len(s) <= max && idPattern.MatchString(s)
}

// ---- device -> gateway ---------------------------------------------------------------------

// frameWriter writes one map; msgpack's Encoder never fails on a bytes.Buffer, so errors are
// dropped here once instead of at every call.
type frameWriter struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
}

func newFrame(fields int, t string) *frameWriter {
	w := &frameWriter{}
	w.enc = msgpack.NewEncoder(&w.buf)
	_ = w.enc.EncodeMapLen(fields)
	w.str("t").str(t)
	return w
}

func (w *frameWriter) str(s string) *frameWriter  { _ = w.enc.EncodeString(s); return w }
func (w *frameWriter) uint(v uint64) *frameWriter { _ = w.enc.EncodeUint(v); return w }
func (w *frameWriter) bin(b []byte) *frameWriter {
	// EncodeBytes writes nil for a nil slice; the wire wants an (empty) bin.
	if b == nil {
		b = []byte{}
	}
	_ = w.enc.EncodeBytes(b)
	return w
}
func (w *frameWriter) mapLen(n int) *frameWriter   { _ = w.enc.EncodeMapLen(n); return w }
func (w *frameWriter) arrayLen(n int) *frameWriter { _ = w.enc.EncodeArrayLen(n); return w }
func (w *frameWriter) bytes() []byte               { return w.buf.Bytes() }

func encodeAuth(token, device string, cursor *Cursor, lanes []string) []byte {
	n := 4
	if cursor != nil {
		n++
	}
	if len(lanes) > 0 {
		n++
	}
	w := newFrame(n, "AUTH")
	w.str("v").uint(ProtocolVersion)
	w.str("token").str(token)
	w.str("device").str(device)
	if cursor != nil {
		// {...token, seq}: the order client/client.ts sends it in
		w.str("cursor").mapLen(5)
		w.str("shard").uint(uint64(cursor.Shard))
		w.str("epoch").uint(uint64(cursor.Epoch))
		w.str("log").str(cursor.Log)
		w.str("sig").bin(cursor.Sig)
		w.str("seq").uint(cursor.Seq)
	}
	if len(lanes) > 0 {
		w.str("lanes").arrayLen(len(lanes))
		for _, l := range lanes {
			w.str(l)
		}
	}
	return w.bytes()
}

func encodeAck(seq uint64) []byte {
	return newFrame(2, "ACK").str("seq").uint(seq).bytes()
}

func encodePull(id uint32, after uint64, limit int) []byte {
	w := newFrame(4, "PULL")
	w.str("id").uint(uint64(id))
	w.str("after").uint(after)
	w.str("limit").uint(uint64(limit))
	return w.bytes()
}

func encodeSend(id uint32, cmid string, body []byte) []byte {
	w := newFrame(4, "SEND")
	w.str("id").uint(uint64(id))
	w.str("cmid").str(cmid)
	w.str("b").bin(body)
	return w.bytes()
}

func encodePing() []byte { return newFrame(1, "PING").bytes() }

func encodeRefresh(token string) []byte {
	return newFrame(2, "REFRESH").str("token").str(token).bytes()
}

// ---- gateway -> device ---------------------------------------------------------------------

// serverFrame is any gateway frame; T says which fields are set.
type serverFrame struct {
	T string

	// AUTH_OK
	Session string
	User    string
	Epoch   uint16
	Cursor  Token
	From    uint64
	Head    uint64
	Trim    uint64
	Lanes   map[string]uint64
	HB      int64

	// AUTH_OK, MSGS
	Shard uint32

	// ERROR
	Error *ErrorFrame

	// MSGS, SEND_OK, PONG, REFRESH_OK (HasID says whether `id` was there)
	ID      uint32
	HasID   bool
	Entries []Entry
	More    bool

	// SYNCED
	Seq uint64

	// SEND_OK
	Cmid string
	Dup  bool

	// REFRESH_OK: ms since the epoch
	Exp int64

	// GOAWAY
	Reason  string
	RetryMs int64
}

// frameError is a gateway frame the SDK cannot take: the client closes with 4002.
type frameError struct{ msg string }

func (e *frameError) Error() string { return "jetgate: bad frame from server: " + e.msg }

func badFrame(format string, args ...any) error {
	return &frameError{msg: fmt.Sprintf(format, args...)}
}

// decodeServerFrame decodes and checks one gateway frame.
func decodeServerFrame(data []byte) (*serverFrame, error) {
	r := bytes.NewReader(data)
	v, err := msgpack.NewDecoder(r).DecodeInterface()
	if err != nil {
		return nil, badFrame("not valid msgpack: %v", err)
	}
	if r.Len() != 0 {
		return nil, badFrame("trailing bytes after the frame")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, badFrame("a frame must be a msgpack map")
	}
	t, _ := m["t"].(string)
	f := &fields{m: m, path: t}
	out := &serverFrame{T: t}
	switch t {
	case "AUTH_OK":
		out.Session = f.id("session", maxIDLength)
		out.User = f.id("user", maxIDLength)
		out.Shard = f.u32("shard")
		out.Epoch = f.epoch("epoch")
		out.Cursor = f.token("cursor")
		out.From = f.u64("from")
		out.Head = f.u64("head")
		out.Trim = f.u64("trim")
		out.Lanes = f.laneMap("lanes")
		out.HB = f.safeInt("hb")
	case "ERROR":
		out.Error = f.errorFrame()
	case "MSGS":
		out.Shard = f.u32("shard")
		out.Entries = f.entries("e", out.Shard)
		out.ID, out.HasID = f.optU32("id")
		if more := f.optBool("more"); more != nil {
			out.More = *more
		}
	case "SYNCED":
		out.Seq = f.u64("seq")
	case "SEND_OK":
		out.ID, out.HasID = f.u32("id"), true
		out.Cmid = f.id("cmid", maxIDLength)
		out.Dup = f.boolean("dup")
	case "PONG":
		out.ID, out.HasID = f.optU32("id")
	case "REFRESH_OK":
		out.ID, out.HasID = f.optU32("id")
		out.Exp = f.safeInt("exp")
	case "GOAWAY":
		out.Reason = f.str("reason", 0, 256)
		out.RetryMs = f.safeInt("retry_ms")
	default:
		if len(t) > 32 {
			t = t[:32]
		}
		return nil, badFrame("unknown frame type %q", t)
	}
	if f.err != nil {
		return nil, f.err
	}
	return out, nil
}

// fields reads the known keys of one decoded map and keeps the first problem; keys it is not
// asked for are ignored (a newer gateway may add fields).
type fields struct {
	m    map[string]any
	path string
	err  error
}

func (f *fields) fail(key, format string, args ...any) {
	if f.err == nil {
		f.err = badFrame("%s.%s: %s", f.path, key, fmt.Sprintf(format, args...))
	}
}

func (f *fields) sub(m map[string]any, path string) *fields {
	return &fields{m: m, path: f.path + "." + path}
}

func (f *fields) adopt(g *fields) {
	if f.err == nil && g.err != nil {
		f.err = g.err
	}
}

// get returns the value of a required key.
func (f *fields) get(key string) (any, bool) {
	v, ok := f.m[key]
	if !ok {
		f.fail(key, "required")
	}
	return v, ok
}

// asUint reads any msgpack integer width, and an integral float up to 2^53 as the TS decoder
// does (msgpackr turns it into a number that passes zod's int check).
func asUint(v any) (uint64, bool) {
	switch n := v.(type) {
	case uint8:
		return uint64(n), true
	case uint16:
		return uint64(n), true
	case uint32:
		return uint64(n), true
	case uint64:
		return n, true
	case int8:
		return uint64(n), n >= 0
	case int16:
		return uint64(n), n >= 0
	case int32:
		return uint64(n), n >= 0
	case int64:
		return uint64(n), n >= 0
	case float32:
		return asUint(float64(n))
	case float64:
		if n >= 0 && n <= maxSafeInteger && n == math.Trunc(n) {
			return uint64(n), true
		}
	}
	return 0, false
}

func (f *fields) uintIn(key string, v any, max uint64) uint64 {
	n, ok := asUint(v)
	if !ok {
		f.fail(key, "must be a non-negative integer")
		return 0
	}
	if n > max {
		f.fail(key, "must be at most %d", max)
		return 0
	}
	return n
}

func (f *fields) u64(key string) uint64 {
	v, ok := f.get(key)
	if !ok {
		return 0
	}
	return f.uintIn(key, v, math.MaxUint64)
}

func (f *fields) optU64(key string) *uint64 {
	v, ok := f.m[key]
	if !ok {
		return nil
	}
	n := f.uintIn(key, v, math.MaxUint64)
	return &n
}

func (f *fields) u32(key string) uint32 {
	v, ok := f.get(key)
	if !ok {
		return 0
	}
	return uint32(f.uintIn(key, v, math.MaxUint32))
}

func (f *fields) optU32(key string) (uint32, bool) {
	v, ok := f.m[key]
	if !ok {
		return 0, false
	}
	return uint32(f.uintIn(key, v, math.MaxUint32)), true
}

func (f *fields) epoch(key string) uint16 {
	v, ok := f.get(key)
	if !ok {
		return 0
	}
	return uint16(f.uintIn(key, v, math.MaxUint16))
}

// safeInt reads a number that is not a u64 (ms timestamps, durations): 0..2^53-1.
func (f *fields) safeInt(key string) int64 {
	v, ok := f.get(key)
	if !ok {
		return 0
	}
	return int64(f.uintIn(key, v, maxSafeInteger))
}

func (f *fields) optSafeInt(key string) *int64 {
	v, ok := f.m[key]
	if !ok {
		return nil
	}
	n := int64(f.uintIn(key, v, maxSafeInteger))
	return &n
}

func (f *fields) boolean(key string) bool {
	v, ok := f.get(key)
	if !ok {
		return false
	}
	b, isBool := v.(bool)
	if !isBool {
		f.fail(key, "must be a boolean")
	}
	return b
}

func (f *fields) optBool(key string) *bool {
	v, ok := f.m[key]
	if !ok {
		return nil
	}
	b, isBool := v.(bool)
	if !isBool {
		f.fail(key, "must be a boolean")
	}
	return &b
}

func (f *fields) str(key string, min, max int) string {
	v, ok := f.get(key)
	if !ok {
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		f.fail(key, "must be a string")
		return ""
	}
	// zod counts UTF-16 units; runes are close enough for a bound that only guards memory
	if n := len([]rune(s)); n < min || n > max {
		f.fail(key, "must be %d..%d characters", min, max)
	}
	return s
}

func (f *fields) id(key string, max int) string {
	v, ok := f.get(key)
	if !ok {
		return ""
	}
	s, isStr := v.(string)
	if !isStr || !validID(s, max) {
		f.fail(key, "must be an id of [A-Za-z0-9_-], 1..%d characters", max)
	}
	return s
}

func (f *fields) bin(key string, exact, max int) []byte {
	v, ok := f.get(key)
	if !ok {
		return nil
	}
	b, isBin := v.([]byte)
	if !isBin {
		f.fail(key, "must be bytes (msgpack bin)")
		return nil
	}
	if exact >= 0 && len(b) != exact {
		f.fail(key, "must be %d bytes", exact)
	}
	if len(b) > max {
		f.fail(key, "must be at most %d bytes", max)
	}
	return b
}

func (f *fields) mapOf(key string, required bool) (map[string]any, bool) {
	v, ok := f.m[key]
	if !ok {
		if required {
			f.fail(key, "required")
		}
		return nil, false
	}
	m, isMap := v.(map[string]any)
	if !isMap {
		f.fail(key, "must be a map")
		return nil, false
	}
	return m, true
}

func (f *fields) tokenFrom(m map[string]any, path string) Token {
	g := f.sub(m, path)
	t := Token{Shard: g.u32("shard"), Epoch: g.epoch("epoch"), Log: g.id("log", maxIDLength), Sig: g.bin("sig", CursorSigBytes, CursorSigBytes)}
	f.adopt(g)
	return t
}

func (f *fields) token(key string) Token {
	m, ok := f.mapOf(key, true)
	if !ok {
		return Token{}
	}
	return f.tokenFrom(m, key)
}

func (f *fields) optToken(key string) *Token {
	m, ok := f.mapOf(key, false)
	if !ok {
		return nil
	}
	t := f.tokenFrom(m, key)
	return &t
}

func (f *fields) laneMap(key string) map[string]uint64 {
	m, ok := f.mapOf(key, true)
	if !ok {
		return nil
	}
	out := make(map[string]uint64, len(m))
	for lane, v := range m {
		if !validID(lane, maxLaneLength) {
			f.fail(key, "lane %q is not a lane id", lane)
			continue
		}
		out[lane] = f.uintIn(key+"."+lane, v, math.MaxUint64)
	}
	return out
}

func (f *fields) oldRange(m map[string]any, path string) OldRange {
	g := f.sub(m, path)
	r := OldRange{Shard: g.u32("shard"), After: g.u64("after"), Until: g.u64("until"), Cursor: g.optToken("cursor")}
	f.adopt(g)
	return r
}

func (f *fields) errorFrame() *ErrorFrame {
	e := &ErrorFrame{
		Code:            f.str("code", 1, 64),
		Msg:             f.str("msg", 0, 1024),
		Fatal:           f.boolean("fatal"),
		NewCursor:       f.optToken("new_cursor"),
		ReplayFromSeq:   f.optU64("replay_from_seq"),
		TrimWatermark:   f.optU64("trim_watermark"),
		RebuildRequired: f.optBool("rebuild_required"),
		RetryMs:         f.optSafeInt("retry_ms"),
	}
	if id, ok := f.optU32("id"); ok {
		e.ID = &id
	}
	if v, ok := f.m["old_ranges"]; ok {
		list, isList := v.([]any)
		switch {
		case !isList:
			f.fail("old_ranges", "must be an array")
		case len(list) > maxOldRanges:
			f.fail("old_ranges", "at most %d ranges", maxOldRanges)
		default:
			for i, item := range list {
				m, isMap := item.(map[string]any)
				if !isMap {
					f.fail("old_ranges", "range %d must be a map", i)
					break
				}
				e.OldRanges = append(e.OldRanges, f.oldRange(m, fmt.Sprintf("old_ranges.%d", i)))
			}
		}
	}
	if m, ok := f.mapOf("old_range", false); ok {
		r := f.oldRange(m, "old_range")
		e.OldRange = &r
	}
	return e
}

func (f *fields) entries(key string, shard uint32) []Entry {
	v, ok := f.get(key)
	if !ok {
		return nil
	}
	list, isList := v.([]any)
	if !isList {
		f.fail(key, "must be an array")
		return nil
	}
	out := make([]Entry, 0, len(list))
	for i, item := range list {
		m, isMap := item.(map[string]any)
		if !isMap {
			f.fail(key, "entry %d must be a map", i)
			return nil
		}
		g := f.sub(m, fmt.Sprintf("%s.%d", key, i))
		e := Entry{
			Seq:   g.u64("seq"),
			ID:    g.id("id", maxIDLength),
			Lane:  g.id("lane", maxLaneLength),
			TS:    g.safeInt("ts"),
			Body:  g.bin("b", -1, MaxBodyBytes),
			Shard: shard,
		}
		// prev is required and nullable: nil when the worker could not know it
		if p, has := g.get("prev"); has && p != nil {
			n := g.uintIn("prev", p, math.MaxUint64)
			e.Prev = &n
		}
		f.adopt(g)
		out = append(out, e)
	}
	return out
}
