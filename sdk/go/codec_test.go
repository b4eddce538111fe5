package jetgate

import (
	"bytes"
	"encoding/hex"
	"math"
	"reflect"
	"strings"
	"testing"
)

// Golden bytes written by protocol/codec.ts's encodeFrame (the gateway's and the TS SDK's
// writer) for the same frames, device frames with their keys in client/client.ts's order.
var golden = map[string]string{
	"auth_full":     "86a174a441555448a17601a5746f6b656eae6a77742e746f6b656e2e68657265a6646576696365a56465765f31a6637572736f7285a5736861726403a565706f6368cd9c40a36c6f67a56c6f672d61a3736967c41007070707070707070707070707070707a3736571cf9c40800000000005a56c616e657392a463686174a764656661756c74",
	"auth_min":      "84a174a441555448a17601a5746f6b656ea174a6646576696365a164",
	"ack_big":       "82a174a341434ba3736571cf9c40800000000005",
	"pull":          "84a174a450554c4ca26964ceee6b2800a56166746572cf9c40800000000005a56c696d6974cd01f4",
	"send_empty":    "84a174a453454e44a2696401a4636d6964a163a162c400",
	"ping":          "81a174a450494e47",
	"refresh":       "82a174a752454652455348a5746f6b656ea5612e622e63",
	"s_auth_ok":     "8ba174a7415554485f4f4ba773657373696f6ea27331a475736572a5616c696365a5736861726403a565706f6368cd9c40a6637572736f7284a5736861726403a565706f6368cd9c40a36c6f67a56c6f672d61a3736967c41007070707070707070707070707070707a466726f6dcf9c40800000000005a468656164cf9c4080000000000fa47472696d00a56c616e657381a463686174cf9c40800000000005a26862cd61a8",
	"s_rebased":     "88a174a54552524f52a4636f6465ae435552534f525f52454241534544a36d7367a772656261736564a5666174616cc2aa6e65775f637572736f7284a5736861726404a565706f6368cd9c41a36c6f67a56c6f672d62a3736967c41007070707070707070707070707070707af7265706c61795f66726f6d5f736571cf9c40800000000005aa6f6c645f72616e6765739184a5736861726403a56166746572cf9c407ffffffffffca5756e74696ccf9c40800000000005a6637572736f7284a5736861726403a565706f6368cd9c40a36c6f67a56c6f672d61a3736967c41007070707070707070707070707070707a96f6c645f72616e676583a5736861726403a56166746572cf9c407ffffffffffca5756e74696ccf9c40800000000005",
	"s_msgs":        "85a174a44d534753a5736861726403a1659286a3736571cf9c40800000000005a26964a36d2d31a46c616e65a463686174a470726576cf9c40800000000004a27473cf0000019ab697e800a162c40301020386a3736571cf9c40800000000006a26964a36d2d31a46c616e65a463686174a470726576c0a27473cf0000019ab697e800a162c403010203a2696402a46d6f7265c3",
	"s_synced":      "82a174a653594e434544a3736571cf9c40800000000005",
	"s_send_ok":     "84a174a753454e445f4f4ba2696409a4636d6964a3632d31a3647570c3",
	"s_goaway":      "83a174a6474f41574159a6726561736f6ea5647261696ea872657472795f6d73cd05dc",
	"s_refresh_ok":  "82a174aa524546524553485f4f4ba3657870cf0000019ab697e800",
	"s_unavailable": "85a174a54552524f52a4636f6465ab554e415641494c41424c45a36d7367a56c61746572a5666174616cc3a872657472795f6d73cd07d0",
}

func gold(t *testing.T, name string) []byte {
	t.Helper()
	b, err := hex.DecodeString(golden[name])
	if err != nil || len(b) == 0 {
		t.Fatalf("golden %s: %v", name, err)
	}
	return b
}

// composeSeq is protocol/seq.ts's: epoch << 48 | offset.
func composeSeq(epoch, offset uint64) uint64 { return epoch<<48 | offset }

var bigSeq = composeSeq(40_000, 1<<47+5)
var sig7 = bytes.Repeat([]byte{7}, 16)

func TestEncodeMatchesTSWriter(t *testing.T) {
	cases := []struct {
		name string
		got  []byte
	}{
		{"auth_full", encodeAuth("jwt.token.here", "dev_1", &Cursor{Token: Token{Shard: 3, Epoch: 40_000, Log: "log-a", Sig: sig7}, Seq: bigSeq}, []string{"chat", "default"})},
		{"auth_min", encodeAuth("t", "d", nil, nil)},
		{"ack_big", encodeAck(bigSeq)},
		{"pull", encodePull(4_000_000_000, bigSeq, 500)},
		{"send_empty", encodeSend(1, "c", nil)},
		{"ping", encodePing()},
		{"refresh", encodeRefresh("a.b.c")},
	}
	for _, c := range cases {
		if want := gold(t, c.name); !bytes.Equal(c.got, want) {
			t.Errorf("%s:\n got %x\nwant %x", c.name, c.got, want)
		}
	}
}

// Every u64 is a msgpack unsigned int of the smallest width; above 2^32 a uint64 (cf).
func TestEncodeU64SmallestUnsignedWidth(t *testing.T) {
	prefix := "82a174a341434ba3736571" // {t: "ACK", seq: ...}
	cases := []struct {
		seq  uint64
		want string
	}{
		{0, "00"},
		{127, "7f"},
		{128, "cc80"},
		{255, "ccff"},
		{256, "cd0100"},
		{65535, "cdffff"},
		{65536, "ce00010000"},
		{math.MaxUint32, "ceffffffff"},
		{1 << 32, "cf0000000100000000"},
		{composeSeq(1, 3), "cf0001000000000003"},
		{math.MaxUint64, "cfffffffffffffffff"},
	}
	for _, c := range cases {
		if got := hex.EncodeToString(encodeAck(c.seq)); got != prefix+c.want {
			t.Errorf("seq %d: got %s, want %s", c.seq, got, prefix+c.want)
		}
	}
	// 300 bytes of body: bin16; a request id above 2^31: uint32
	send := encodeSend(9, "c-1", bytes.Repeat([]byte{9}, 300))
	if !bytes.HasPrefix(send, mustHex("84a174a453454e44a2696409a4636d6964a3632d31a162c5012c")) {
		t.Errorf("send header: %x", send[:30])
	}
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func TestDecodeGatewayFrames(t *testing.T) {
	tok := func(shard uint32, epoch uint16, log string) Token {
		return Token{Shard: shard, Epoch: epoch, Log: log, Sig: sig7}
	}
	f, err := decodeServerFrame(gold(t, "s_auth_ok"))
	if err != nil {
		t.Fatal(err)
	}
	want := &serverFrame{T: "AUTH_OK", Session: "s1", User: "alice", Shard: 3, Epoch: 40_000, Cursor: tok(3, 40_000, "log-a"), From: bigSeq, Head: bigSeq + 10, Trim: 0, Lanes: map[string]uint64{"chat": bigSeq}, HB: 25000}
	if !reflect.DeepEqual(f, want) {
		t.Errorf("AUTH_OK:\n got %+v\nwant %+v", f, want)
	}

	f, err = decodeServerFrame(gold(t, "s_rebased"))
	if err != nil {
		t.Fatal(err)
	}
	pc := tok(3, 40_000, "log-a")
	nc := tok(4, 40_001, "log-b")
	from := bigSeq
	wantErr := &ErrorFrame{Code: CodeCursorRebased, Msg: "rebased", NewCursor: &nc, ReplayFromSeq: &from,
		OldRanges: []OldRange{{Shard: 3, After: bigSeq - 9, Until: bigSeq, Cursor: &pc}},
		OldRange:  &OldRange{Shard: 3, After: bigSeq - 9, Until: bigSeq}}
	if !reflect.DeepEqual(f.Error, wantErr) {
		t.Errorf("CURSOR_REBASED:\n got %+v\nwant %+v", f.Error, wantErr)
	}

	f, err = decodeServerFrame(gold(t, "s_msgs"))
	if err != nil {
		t.Fatal(err)
	}
	prev := bigSeq - 1
	wantEntries := []Entry{
		{Seq: bigSeq, ID: "m-1", Lane: "chat", Prev: &prev, TS: 1_764_000_000_000, Body: []byte{1, 2, 3}, Shard: 3},
		{Seq: bigSeq + 1, ID: "m-1", Lane: "chat", Prev: nil, TS: 1_764_000_000_000, Body: []byte{1, 2, 3}, Shard: 3},
	}
	if f.T != "MSGS" || f.Shard != 3 || !f.HasID || f.ID != 2 || !f.More || !reflect.DeepEqual(f.Entries, wantEntries) {
		t.Errorf("MSGS: %+v", f)
	}

	checks := map[string]func(*serverFrame) bool{
		"s_synced":     func(f *serverFrame) bool { return f.T == "SYNCED" && f.Seq == bigSeq },
		"s_send_ok":    func(f *serverFrame) bool { return f.T == "SEND_OK" && f.ID == 9 && f.Cmid == "c-1" && f.Dup },
		"s_goaway":     func(f *serverFrame) bool { return f.T == "GOAWAY" && f.Reason == "drain" && f.RetryMs == 1500 },
		"s_refresh_ok": func(f *serverFrame) bool { return f.T == "REFRESH_OK" && f.Exp == 1_764_000_000_000 && !f.HasID },
		"s_unavailable": func(f *serverFrame) bool {
			return f.T == "ERROR" && f.Error.Code == CodeUnavailable && f.Error.Fatal && *f.Error.RetryMs == 2000
		},
	}
	for name, ok := range checks {
		f, err := decodeServerFrame(gold(t, name))
		if err != nil || !ok(f) {
			t.Errorf("%s: %+v %v", name, f, err)
		}
	}
}

// Decoders accept any unsigned width (and the signed widths msgpack writers use for small
// non-negative numbers), and drop keys they do not know.
func TestDecodeLenient(t *testing.T) {
	for _, h := range []string{"05", "cc05", "cd0005", "ce00000005", "cf0000000000000005", "d005", "d10005", "d200000005", "d30000000000000005"} {
		// {t: "SYNCED", seq: 5}
		f, err := decodeServerFrame(mustHex("82a174a653594e434544a3736571" + h))
		if err != nil || f.Seq != 5 {
			t.Errorf("width %s: %+v %v", h, f, err)
		}
	}
	// {t: "PONG", future: {x: [1]}, id: 3}
	w := newFrame(3, "PONG")
	w.str("future").mapLen(1).str("x").arrayLen(1).uint(1)
	w.str("id").uint(3)
	f, err := decodeServerFrame(w.bytes())
	if err != nil || f.T != "PONG" || !f.HasID || f.ID != 3 {
		t.Errorf("unknown key: %+v %v", f, err)
	}
}

func TestDecodeRefusesWhatZodRefuses(t *testing.T) {
	cases := map[string][]byte{
		"not msgpack":    {0xc1},
		"truncated":      mustHex("82a174a653594e434544a3736571cd00"),
		"trailing bytes": append(encodeAck(1), 0x00),
		"not a map":      mustHex("93010203"),
		"unknown type":   newFrame(1, "HELLO").bytes(),
		"missing t":      mustHex("81a3736571" + "05"),
		"negative seq":   mustHex("82a174a653594e434544a3736571ff"),
		"float seq":      mustHex("82a174a653594e434544a3736571cb3ff8000000000000"),
		"string seq":     mustHex("82a174a653594e434544a3736571a131"),
		"missing seq":    newFrame(1, "SYNCED").bytes(),
		"shard above u32": func() []byte {
			w := newFrame(3, "MSGS")
			w.str("shard").uint(1 << 32).str("e").arrayLen(0)
			return w.bytes()
		}(),
		"bad entry id": func() []byte {
			w := newFrame(3, "MSGS")
			w.str("shard").uint(1).str("e").arrayLen(1)
			w.mapLen(6).str("seq").uint(1).str("id").str("a.b").str("lane").str("l").str("prev").uint(0).str("ts").uint(1).str("b").bin([]byte{1})
			return w.bytes()
		}(),
		"entry without prev": func() []byte {
			w := newFrame(3, "MSGS")
			w.str("shard").uint(1).str("e").arrayLen(1)
			w.mapLen(5).str("seq").uint(1).str("id").str("a").str("lane").str("l").str("ts").uint(1).str("b").bin([]byte{1})
			return w.bytes()
		}(),
		"short sig": func() []byte {
			w := newFrame(5, "ERROR")
			w.str("code").str("CURSOR_INVALID").str("msg").str("").str("fatal")
			_ = w.enc.EncodeBool(false)
			w.str("new_cursor").mapLen(4).str("shard").uint(1).str("epoch").uint(1).str("log").str("L").str("sig").bin([]byte{1})
			return w.bytes()
		}(),
		"body over 256 KiB": func() []byte {
			w := newFrame(3, "MSGS")
			w.str("shard").uint(1).str("e").arrayLen(1)
			w.mapLen(6).str("seq").uint(1).str("id").str("a").str("lane").str("l").str("prev").uint(0).str("ts").uint(1).str("b").bin(make([]byte, MaxBodyBytes+1))
			return w.bytes()
		}(),
		"timestamp ext": mustHex("82a174a653594e434544a3736571d6ff00000001"),
	}
	for name, b := range cases {
		if f, err := decodeServerFrame(b); err == nil {
			t.Errorf("%s: decoded %+v", name, f)
		} else if !strings.HasPrefix(err.Error(), "jetgate: bad frame from server") {
			t.Errorf("%s: %v", name, err)
		}
	}
}
