// Command jetgate-conformance is the Go SDK's driver for jetgate's conformance kit
// (docs/conformance.md): JSON commands on stdin, JSON events on stdout, one object per line.
// Seqs are decimal strings, bodies base64. Diagnostics go to stderr, which the kit keeps.
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	jetgate "github.com/jetgate/jetgate/sdk/go"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	d := newDriver(os.Stdout, os.Stderr)
	lines := make(chan []byte)
	go readLines(os.Stdin, lines)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				// the kit went away without `stop`: close as an app would, quietly
				d.shutdown()
				os.Exit(0)
			}
			if d.handle(line) {
				os.Exit(0)
			}
		case <-sigs:
			d.shutdown()
			os.Exit(0)
		}
	}
}

// readLines hands over stdin line by line (no length limit: a `send` carries a body).
func readLines(r io.Reader, out chan<- []byte) {
	defer close(out)
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(strings.TrimSpace(string(line))) > 0 {
			out <- line
		}
		if err != nil {
			return
		}
	}
}

// command is one line from the kit; fields a command does not use are ignored.
type command struct {
	Cmd    string          `json:"cmd"`
	URLs   []string        `json:"urls"`
	Device string          `json:"device"`
	Store  string          `json:"store"`
	Lanes  []string        `json:"lanes"`
	Req    json.RawMessage `json:"req"`
	Token  string          `json:"token"`
	Cmid   string          `json:"cmid"`
	B      string          `json:"b"`
	N      int64           `json:"n"`
}

func parseCommand(line []byte) (command, error) {
	var c command
	if err := json.Unmarshal(line, &c); err != nil {
		return c, fmt.Errorf("not a JSON command: %w", err)
	}
	if c.Cmd == "" {
		return c, errors.New("no cmd")
	}
	return c, nil
}

// reqKey is a request id as a map key whatever JSON type the kit gives it (1 and "1" match).
func reqKey(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return strings.TrimSpace(string(raw))
}

// field is one key of an event line.
type field struct {
	k string
	v any
}

// events writes one JSON object per line, `ev` first, one line at a time.
type events struct {
	mu  sync.Mutex
	out io.Writer
}

func (w *events) write(ev string, fields ...field) {
	var b strings.Builder
	b.WriteString(`{"ev":`)
	evJSON, _ := json.Marshal(ev)
	b.Write(evJSON)
	for _, f := range fields {
		k, _ := json.Marshal(f.k)
		v, err := json.Marshal(f.v)
		if err != nil {
			v = []byte("null")
		}
		b.WriteByte(',')
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteString("}\n")
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = io.WriteString(w.out, b.String())
}

func seqString(v uint64) string { return strconv.FormatUint(v, 10) }

type driver struct {
	ev     *events
	errOut io.Writer

	client *jetgate.Client
	// failNext: the handler fails for this many more entries
	failNext atomic.Int64

	mu      sync.Mutex
	nextReq int
	tokens  map[string]chan string
	sends   sync.WaitGroup
}

func newDriver(out, errOut io.Writer) *driver {
	d := &driver{ev: &events{out: out}, errOut: errOut, tokens: make(map[string]chan string)}
	d.ev.write("hello", field{"sdk", "jetgate-go"}, field{"version", jetgate.Version}, field{"protocol", jetgate.ProtocolVersion})
	return d
}

func (d *driver) logf(format string, args ...any) {
	fmt.Fprintf(d.errOut, "jetgate-conformance: "+format+"\n", args...)
}

// handle runs one command line; true after `stop` (the process then exits 0).
func (d *driver) handle(line []byte) bool {
	c, err := parseCommand(line)
	if err != nil {
		d.logf("%v: %s", err, strings.TrimSpace(string(line)))
		return false
	}
	switch c.Cmd {
	case "start":
		d.start(c)
	case "token":
		d.mu.Lock()
		ch, ok := d.tokens[reqKey(c.Req)]
		delete(d.tokens, reqKey(c.Req))
		d.mu.Unlock()
		if !ok {
			d.logf("token for a request not waiting: %s", c.Req)
			return false
		}
		ch <- c.Token
	case "send":
		d.send(c)
	case "fail_next":
		d.failNext.Store(c.N)
	case "stop":
		d.shutdown()
		d.ev.write("stopped")
		return true
	default:
		d.logf("unknown command %q", c.Cmd)
	}
	return false
}

func (d *driver) start(c command) {
	if d.client != nil {
		d.logf("started already")
		return
	}
	client, err := jetgate.New(jetgate.Options{
		URLs:      c.URLs,
		Device:    c.Device,
		Lanes:     c.Lanes,
		Store:     jetgate.NewFileStore(c.Store),
		Token:     d.token,
		OnEntry:   d.onEntry,
		OnRebuild: d.onRebuild,
		OnEvent:   d.onEvent,
	})
	if err == nil {
		err = client.Start(context.Background())
	}
	if err != nil {
		d.logf("start: %v", err)
		return
	}
	d.client = client
}

// token asks the kit (`token` event) and waits for its `token` command.
func (d *driver) token(ctx context.Context) (string, error) {
	ch := make(chan string, 1)
	d.mu.Lock()
	d.nextReq++
	req := d.nextReq
	d.tokens[strconv.Itoa(req)] = ch
	d.mu.Unlock()
	d.ev.write("token", field{"req", req})
	select {
	case t := <-ch:
		return t, nil
	case <-ctx.Done():
		d.mu.Lock()
		delete(d.tokens, strconv.Itoa(req))
		d.mu.Unlock()
		return "", ctx.Err()
	}
}

// onEntry writes `entry` from inside the handler, before it returns: the kit counts the line as
// the app's effect.
func (d *driver) onEntry(_ context.Context, e jetgate.Entry) error {
	for {
		n := d.failNext.Load()
		if n <= 0 {
			break
		}
		if d.failNext.CompareAndSwap(n, n-1) {
			d.ev.write("handler_failed", field{"seq", seqString(e.Seq)}, field{"id", e.ID})
			return errors.New("fail_next")
		}
	}
	var prev any
	if e.Prev != nil {
		prev = seqString(*e.Prev)
	}
	d.ev.write("entry", field{"seq", seqString(e.Seq)}, field{"id", e.ID}, field{"lane", e.Lane}, field{"shard", e.Shard},
		field{"prev", prev}, field{"b", base64.StdEncoding.EncodeToString(e.Body)})
	return nil
}

func (d *driver) onRebuild(_ context.Context, trim uint64) error {
	d.ev.write("rebuild", field{"trim_watermark", seqString(trim)})
	return nil
}

func (d *driver) onEvent(e jetgate.Event) {
	switch e.Type {
	case jetgate.EventState:
		if e.State.Type == jetgate.StateIdle {
			return
		}
		fields := []field{{"state", string(e.State.Type)}}
		if e.State.Reason != "" {
			fields = append(fields, field{"reason", e.State.Reason})
		}
		if e.State.Type == jetgate.StateWaiting {
			fields = append(fields, field{"delay_ms", e.State.Delay.Milliseconds()})
		}
		d.ev.write("state", fields...)
	case jetgate.EventSynced:
		d.ev.write("synced", field{"seq", seqString(e.Seq)})
	case jetgate.EventRebased:
		d.ev.write("rebased", field{"replay_from", seqString(e.Seq)})
	case jetgate.EventCursorInvalid:
		d.ev.write("cursor_invalid")
	case jetgate.EventError:
		d.ev.write("error", field{"code", e.Frame.Code}, field{"fatal", e.Frame.Fatal})
	case jetgate.EventClosed:
		d.ev.write("closed", field{"code", e.Code}, field{"reason", e.Reason})
	case jetgate.EventSignedOut:
		d.ev.write("signed_out")
	case jetgate.EventCursorSaved:
		d.ev.write("cursor", field{"seq", seqString(e.Seq)})
	case jetgate.EventHandlerError, jetgate.EventRebuildError, jetgate.EventStoreError:
		d.logf("%s: %v", e.Type, e.Err)
	case jetgate.EventGoaway:
		d.logf("goaway %q, reconnect after %v", e.Reason, e.Delay)
	case jetgate.EventReconnectRequested:
		d.logf("reconnect requested: %s", e.Reason)
	}
}

func (d *driver) send(c command) {
	req := c.Req
	if len(req) == 0 {
		req = json.RawMessage("null")
	}
	body, err := base64.StdEncoding.DecodeString(c.B)
	if err == nil && d.client == nil {
		err = errors.New("not started")
	}
	if err != nil {
		d.ev.write("send_failed", field{"req", req}, field{"error", err.Error()})
		return
	}
	d.sends.Add(1)
	go func() {
		defer d.sends.Done()
		dup, err := d.client.Send(context.Background(), body, c.Cmid)
		if err != nil {
			d.ev.write("send_failed", field{"req", req}, field{"error", err.Error()})
			return
		}
		d.ev.write("sent", field{"req", req}, field{"dup", dup})
	}()
}

// shutdown closes the client (the cursor of the entry in hand saved) and waits for the sends it
// failed to be answered, so `stopped` is the last line.
func (d *driver) shutdown() {
	if d.client != nil {
		_ = d.client.Close()
	}
	d.sends.Wait()
}
