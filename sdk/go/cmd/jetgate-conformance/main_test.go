package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	jetgate "github.com/jetgate/jetgate/sdk/go"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// lineBuf collects the driver's stdout.
type lineBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lineBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lineBuf) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if s == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("not a JSON line: %q", s)
		}
		out = append(out, m)
	}
	return out
}

// waitFor returns the first line with ev (and the fields in match), waiting up to 5 s.
func (l *lineBuf) waitFor(t *testing.T, ev string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range l.lines(t) {
			if m["ev"] == ev {
				return m
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no %q line in %v", ev, l.lines(t))
	return nil
}

func TestParseCommand(t *testing.T) {
	c, err := parseCommand([]byte(`{"cmd":"start","urls":["ws://a/v1/ws","ws://b/v1/ws"],"device":"d1","store":"/tmp/s.json","lanes":["chat"],"extra":{"x":1}}`))
	if err != nil || c.Cmd != "start" || len(c.URLs) != 2 || c.Device != "d1" || c.Store != "/tmp/s.json" || c.Lanes[0] != "chat" {
		t.Fatalf("start: %+v %v", c, err)
	}
	c, err = parseCommand([]byte(`{"cmd":"send","req":7,"cmid":"c-1","b":"aGk="}` + "\n"))
	if err != nil || reqKey(c.Req) != "7" || c.Cmid != "c-1" || c.B != "aGk=" {
		t.Fatalf("send: %+v %v", c, err)
	}
	if reqKey(json.RawMessage(`"7"`)) != "7" {
		t.Fatal(`a string req "7" matches 7`)
	}
	c, err = parseCommand([]byte(`{"cmd":"fail_next","n":3}`))
	if err != nil || c.N != 3 {
		t.Fatalf("fail_next: %+v %v", c, err)
	}
	for _, bad := range []string{"", "nope", `{"n":1}`, `["cmd"]`} {
		if _, err := parseCommand([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestEventLines(t *testing.T) {
	var out lineBuf
	d := newDriver(&out, &bytes.Buffer{})
	prev := uint64(18446744073709551614)
	d.handle([]byte(`{"cmd":"fail_next","n":2}`))
	e := jetgate.Entry{Seq: 18446744073709551615, ID: "m-1", Lane: "chat", Prev: &prev, Body: []byte{0, 1, 0xff}, Shard: 7}
	for range 2 {
		if err := d.onEntry(context.Background(), e); err == nil {
			t.Fatal("fail_next did not fail")
		}
	}
	if err := d.onEntry(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	e.Prev = nil
	_ = d.onEntry(context.Background(), e)
	_ = d.onRebuild(context.Background(), 42)
	d.onEvent(jetgate.Event{Type: jetgate.EventError, Frame: &jetgate.ErrorFrame{Code: "CURSOR_REBASED"}})
	d.onEvent(jetgate.Event{Type: jetgate.EventState, State: jetgate.State{Type: jetgate.StateClosed, Reason: "bye"}})
	want := []string{
		`{"ev":"hello","sdk":"jetgate-go","version":"` + jetgate.Version + `","protocol":1}`,
		`{"ev":"handler_failed","seq":"18446744073709551615","id":"m-1"}`,
		`{"ev":"handler_failed","seq":"18446744073709551615","id":"m-1"}`,
		`{"ev":"entry","seq":"18446744073709551615","id":"m-1","lane":"chat","shard":7,"prev":"18446744073709551614","b":"AAH/"}`,
		`{"ev":"entry","seq":"18446744073709551615","id":"m-1","lane":"chat","shard":7,"prev":null,"b":"AAH/"}`,
		`{"ev":"rebuild","trim_watermark":"42"}`,
		`{"ev":"error","code":"CURSOR_REBASED","fatal":false}`,
		`{"ev":"state","state":"closed","reason":"bye"}`,
	}
	if got := strings.Split(strings.TrimSpace(out.b.String()), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A whole life: start, the token asked and answered, an entry applied from inside the handler,
// the cursor stored in the file, a send, stop answered last.
func TestDriverAgainstAGateway(t *testing.T) {
	frame := func(m map[string]any) []byte {
		b, err := msgpack.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	sig := bytes.Repeat([]byte{3}, 16)
	var handlers sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := context.Background()
		write := func(m map[string]any) { _ = c.Write(ctx, websocket.MessageBinary, frame(m)) }
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			var f map[string]any
			_ = msgpack.Unmarshal(data, &f)
			switch f["t"] {
			case "AUTH":
				cursor := map[string]any{"shard": 0, "epoch": 1, "log": "L", "sig": sig}
				write(map[string]any{"t": "AUTH_OK", "session": "s", "user": "u", "shard": 0, "epoch": 1, "cursor": cursor,
					"from": 0, "head": 1, "trim": 0, "lanes": map[string]any{}, "hb": 25000})
				write(map[string]any{"t": "MSGS", "shard": 0, "e": []any{map[string]any{"seq": uint64(1)<<48 + 1, "id": "m1", "lane": "default", "prev": 0, "ts": 1, "b": []byte("hi")}}})
				write(map[string]any{"t": "SYNCED", "seq": uint64(1)<<48 + 1})
			case "SEND":
				write(map[string]any{"t": "SEND_OK", "id": f["id"], "cmid": f["cmid"], "dup": false})
			}
		}
	}))
	defer func() {
		srv.CloseClientConnections()
		srv.Close()
		handlers.Wait()
	}()
	var out lineBuf
	d := newDriver(&out, &bytes.Buffer{})
	store := filepath.Join(t.TempDir(), "cursor.json")
	start, _ := json.Marshal(map[string]any{"cmd": "start", "urls": []string{"ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/ws"}, "device": "d1", "store": store})
	d.handle(start)
	tok := out.waitFor(t, "token")
	answer, _ := json.Marshal(map[string]any{"cmd": "token", "req": tok["req"], "token": "jwt"})
	d.handle(answer)
	entry := out.waitFor(t, "entry")
	if entry["seq"] != "281474976710657" || entry["id"] != "m1" || entry["prev"] != "0" || entry["b"] != "aGk=" {
		t.Fatalf("entry %v", entry)
	}
	out.waitFor(t, "synced")
	out.waitFor(t, "cursor")
	d.handle([]byte(`{"cmd":"send","req":"s1","cmid":"c-1","b":"aGk="}`))
	if sent := out.waitFor(t, "sent"); sent["req"] != "s1" || sent["dup"] != false {
		t.Fatalf("sent %v", sent)
	}
	if !d.handle([]byte(`{"cmd":"stop"}`)) {
		t.Fatal("stop did not end the driver")
	}
	lines := out.lines(t)
	if last := lines[len(lines)-1]; last["ev"] != "stopped" {
		t.Fatalf("last line %v", last)
	}
	b, err := os.ReadFile(store)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := jetgate.UnmarshalCursor(b); !ok || c.Seq != 1<<48+1 {
		t.Fatalf("stored cursor %s", b)
	}
}
