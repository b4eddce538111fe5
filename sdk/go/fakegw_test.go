package jetgate

// An in-process fake gateway: httptest + coder/websocket speaking the frames. The test scripts
// the gateway's side: it reads the device's frames and writes gateway frames by hand.

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/vmihailenco/msgpack/v5"
)

const waitLimit = 5 * time.Second

type fakeGateway struct {
	t     *testing.T
	srv   *httptest.Server
	url   string
	conns chan *gwConn
	wg    sync.WaitGroup
	mu    sync.Mutex
	all   []*gwConn
}

func newGateway(t *testing.T) *fakeGateway {
	g := &fakeGateway{t: t, conns: make(chan *gwConn, 32)}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.wg.Add(1)
		defer g.wg.Done()
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c.SetReadLimit(1 << 20)
		gc := &gwConn{c: c, frames: make(chan clientFrame, 1024), closed: make(chan struct{}), at: time.Now()}
		g.mu.Lock()
		g.all = append(g.all, gc)
		g.mu.Unlock()
		g.conns <- gc
		// the handler lives as long as the socket, so the test can wait for it
		gc.readLoop()
	}))
	g.url = "ws" + strings.TrimPrefix(g.srv.URL, "http") + "/v1/ws"
	t.Cleanup(g.close)
	return g
}

func (g *fakeGateway) close() {
	g.mu.Lock()
	all := g.all
	g.mu.Unlock()
	for _, c := range all {
		_ = c.c.CloseNow()
	}
	g.wg.Wait()
	g.srv.Close()
}

// next waits for the device's next connection.
func (g *fakeGateway) next(t *testing.T) *gwConn {
	t.Helper()
	select {
	case c := <-g.conns:
		return c
	case <-time.After(waitLimit):
		t.Fatal("no connection from the device")
		return nil
	}
}

// none checks that the device does not connect within d.
func (g *fakeGateway) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-g.conns:
		t.Fatal("the device connected again")
	case <-time.After(d):
	}
}

type clientFrame map[string]any

func (f clientFrame) t() string { s, _ := f["t"].(string); return s }

func (f clientFrame) u64(key string) uint64 {
	n, ok := asUint(f[key])
	if !ok {
		panic("not a uint: " + key)
	}
	return n
}

type gwConn struct {
	c         *websocket.Conn
	frames    chan clientFrame
	closed    chan struct{}
	closeCode int
	at        time.Time
}

func (gc *gwConn) readLoop() {
	defer close(gc.closed)
	for {
		typ, data, err := gc.c.Read(context.Background())
		if err != nil {
			gc.closeCode = int(websocket.CloseStatus(err))
			return
		}
		if typ != websocket.MessageBinary {
			continue
		}
		v, err := msgpack.NewDecoder(bytes.NewReader(data)).DecodeInterface()
		if err != nil {
			panic(err)
		}
		gc.frames <- clientFrame(v.(map[string]any))
	}
}

// read returns the device's next frame of one of the types, skipping PING and ACK unless asked.
// Frames that came before the close are read first: readLoop queues every frame before it closes
// gc.closed, so once both are ready the close must not win the select by chance.
func (gc *gwConn) read(t *testing.T, types ...string) clientFrame {
	t.Helper()
	timeout := time.After(waitLimit)
	for {
		var f clientFrame
		select {
		case f = <-gc.frames:
		case <-gc.closed:
			select {
			case f = <-gc.frames:
			default:
				t.Fatalf("the socket closed (%d) while waiting for %v", gc.closeCode, types)
			}
		case <-timeout:
			t.Fatalf("no %v from the device", types)
		}
		for _, ty := range types {
			if f.t() == ty {
				return f
			}
		}
		if f.t() != "PING" && f.t() != "ACK" {
			t.Fatalf("got %v while waiting for %v", f, types)
		}
	}
}

func (gc *gwConn) send(t *testing.T, frames ...[]byte) {
	t.Helper()
	for _, f := range frames {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		err := gc.c.Write(ctx, websocket.MessageBinary, f)
		cancel()
		if err != nil {
			t.Fatalf("gateway write: %v", err)
		}
	}
}

func (gc *gwConn) closeWith(code int, reason string) {
	_ = gc.c.Close(websocket.StatusCode(code), reason)
}

// waitClosed waits for the socket to end and returns the device's close code.
func (gc *gwConn) waitClosed(t *testing.T) int {
	t.Helper()
	select {
	case <-gc.closed:
		return gc.closeCode
	case <-time.After(waitLimit):
		t.Fatal("the device did not close the socket")
		return 0
	}
}

// ---- gateway frames --------------------------------------------------------------------------

// kv is a msgpack map written in order: key, value, key, value...
type kv []any

func writeValue(w *frameWriter, v any) {
	switch x := v.(type) {
	case nil:
		_ = w.enc.EncodeNil()
	case bool:
		_ = w.enc.EncodeBool(x)
	case string:
		w.str(x)
	case []byte:
		w.bin(x)
	case int:
		w.uint(uint64(x))
	case uint64:
		w.uint(x)
	case uint32:
		w.uint(uint64(x))
	case uint16:
		w.uint(uint64(x))
	case kv:
		w.mapLen(len(x) / 2)
		for i := 0; i < len(x); i += 2 {
			w.str(x[i].(string))
			writeValue(w, x[i+1])
		}
	case []kv:
		w.arrayLen(len(x))
		for _, item := range x {
			writeValue(w, item)
		}
	default:
		panic("cannot write a value of this type")
	}
}

func frame(t string, pairs ...any) []byte {
	w := newFrame(1+len(pairs)/2, t)
	for i := 0; i < len(pairs); i += 2 {
		w.str(pairs[i].(string))
		writeValue(w, pairs[i+1])
	}
	return w.bytes()
}

func tokKV(t Token) kv { return kv{"shard", t.Shard, "epoch", t.Epoch, "log", t.Log, "sig", t.Sig} }

func authOK(from uint64, tok Token, hbMs int) []byte {
	return frame("AUTH_OK", "session", "s1", "user", "u1", "shard", tok.Shard, "epoch", tok.Epoch, "cursor", tokKV(tok),
		"from", from, "head", from, "trim", 0, "lanes", kv{}, "hb", hbMs)
}

// ent is an entry; prev is a uint64 or nil.
func ent(seq uint64, id string, prev any) kv {
	return kv{"seq", seq, "id", id, "lane", "default", "prev", prev, "ts", 1_764_000_000_000, "b", []byte(id)}
}

func msgs(shard uint32, es ...kv) []byte { return frame("MSGS", "shard", shard, "e", es) }

func pullReplyFrame(id uint64, shard uint32, more bool, es ...kv) []byte {
	return frame("MSGS", "shard", shard, "e", es, "id", id, "more", more)
}

func syncedAt(seq uint64) []byte { return frame("SYNCED", "seq", seq) }

func rangeKV(tok Token, after uint64) kv {
	return kv{"shard", tok.Shard, "after", after, "until", after + 10, "cursor", tokKV(tok)}
}

func rebasedFrame(to Token, from uint64, ranges ...kv) []byte {
	if len(ranges) == 0 {
		return frame("ERROR", "code", CodeCursorRebased, "msg", "", "fatal", false, "new_cursor", tokKV(to), "replay_from_seq", from)
	}
	return frame("ERROR", "code", CodeCursorRebased, "msg", "", "fatal", false, "new_cursor", tokKV(to), "replay_from_seq", from,
		"old_ranges", ranges, "old_range", ranges[0])
}
