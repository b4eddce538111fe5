package jetgate

import (
	"context"
	"encoding/base64"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestRecentIDs(t *testing.T) {
	r := newRecentIDs(3)
	for _, id := range []string{"a", "b", "c", "a"} {
		r.add(id)
	}
	if !r.has("a") || !r.has("b") || !r.has("c") || r.len() != 3 {
		t.Fatal("window of 3 keeps 3 ids; a repeat adds nothing")
	}
	r.add("d")
	if r.has("a") || !r.has("d") || r.len() != 3 {
		t.Fatal("past the window the oldest id is forgotten")
	}
	r.add("e")
	r.add("f")
	r.add("g")
	if r.has("b") || r.has("c") || r.has("d") || !r.has("e") || !r.has("g") || r.len() != 3 {
		t.Fatal("the ring keeps the newest")
	}
}

func TestBackoffFullJitterUnderCeiling(t *testing.T) {
	b := Backoff{Base: 250 * time.Millisecond, Cap: 30 * time.Second}
	wantCeil := []time.Duration{250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000}
	for i, w := range wantCeil {
		if got := b.Ceiling(i); got != w*time.Millisecond {
			t.Errorf("ceiling %d: %v, want %v", i, got, w*time.Millisecond)
		}
		if d := b.Delay(i, 0); d != 0 {
			t.Errorf("delay %d at 0: %v", i, d)
		}
		if d := b.Delay(i, 0.5); d != w*time.Millisecond/2 {
			t.Errorf("delay %d at 0.5: %v", i, d)
		}
		if d := b.Delay(i, math.Nextafter(1, 0)); d > w*time.Millisecond || d < w*time.Millisecond*99/100 {
			t.Errorf("delay %d near 1: %v", i, d)
		}
	}
	if got := (Backoff{Base: time.Minute, Cap: time.Hour}).Ceiling(1000); got != time.Hour {
		t.Errorf("a huge attempt stays at the cap: %v", got)
	}
}

func TestReconnectorResetGoawayNow(t *testing.T) {
	r := reconnector{backoff: Backoff{Base: 100 * time.Millisecond, Cap: time.Second}, random: func() float64 { return 0.5 }}
	steps := []string{}
	next := func() {
		a, d := r.next()
		steps = append(steps, fmt.Sprintf("%d:%v", a, d))
	}
	next()
	next()
	r.retryAfter(1500 * time.Millisecond)
	next()
	next()
	r.reset()
	next()
	r.now()
	next()
	next()
	want := []string{"0:50ms", "1:100ms", "2:1.5s", "3:400ms", "0:50ms", "0:0s", "1:100ms"}
	if !reflect.DeepEqual(steps, want) {
		t.Fatalf("got %v, want %v", steps, want)
	}
}

func TestClosePolicy(t *testing.T) {
	cases := map[int]policy{
		4300: policyNow, 4350: policyNow, 4399: policyNow,
		4403: policyStop, 4409: policyStop, 4600: policyStop, 4650: policyStop, 4699: policyStop,
		1000: policyBackoff, 1001: policyBackoff, 1006: policyBackoff, 4000: policyBackoff, 4001: policyBackoff,
		4299: policyBackoff, 4400: policyBackoff, 4401: policyBackoff, 4408: policyBackoff, 4413: policyBackoff,
		4429: policyBackoff, 4500: policyBackoff, 4503: policyBackoff, 4599: policyBackoff, 4700: policyBackoff,
	}
	for code, want := range cases {
		if got := policyFor(code); got != want {
			t.Errorf("%d: %v, want %v", code, got, want)
		}
	}
}

func TestRefreshDelay(t *testing.T) {
	cases := map[time.Duration]time.Duration{
		60 * time.Second:        45 * time.Second,
		time.Hour:               45 * time.Minute,
		1000 * time.Millisecond: time.Second,
		0:                       time.Second,
		-time.Minute:            time.Second,
		100 * 24 * time.Hour:    math.MaxInt32 * time.Millisecond,
	}
	for left, want := range cases {
		if got := refreshDelay(left); got != want {
			t.Errorf("%v left: %v, want %v", left, got, want)
		}
	}
}

func jwtWith(payload string) string {
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(`{"alg":"HS256"}`)) + "." + enc.EncodeToString([]byte(payload)) + ".sig"
}

func TestTokenExpiry(t *testing.T) {
	exp, ok := tokenExpiry(jwtWith(`{"sub":"u","exp":1764000000}`))
	if !ok || exp.UnixMilli() != 1_764_000_000_000 {
		t.Fatalf("exp %v %v", exp, ok)
	}
	// the standard alphabet with padding reads too
	std := "x." + base64.StdEncoding.EncodeToString([]byte(`{"exp":1764000000, "n":"??>"}`)) + ".y"
	if exp, ok := tokenExpiry(std); !ok || exp.Unix() != 1_764_000_000 {
		t.Fatalf("std: %v %v", exp, ok)
	}
	for _, bad := range []string{"", "abc", "a.!!!.c", jwtWith(`{"exp":"soon"}`), jwtWith(`{"sub":"u"}`), jwtWith(`not json`)} {
		if _, ok := tokenExpiry(bad); ok {
			t.Errorf("%q read", bad)
		}
	}
}

func TestCursorJSONForm(t *testing.T) {
	c := Cursor{Token: Token{Shard: 3, Epoch: 40_000, Log: "log-a", Sig: sig7}, Seq: bigSeq}
	got := string(MarshalCursor(c))
	// JSON.stringify's output for client/cursor-store.ts's serializeCursor of the same cursor
	want := `{"shard":3,"epoch":40000,"log":"log-a","seq":"11259139805914595333","sig":"07070707070707070707070707070707"}`
	if got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
	back, ok := UnmarshalCursor([]byte(got))
	if !ok || !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip: %+v %v", back, ok)
	}
	for _, bad := range []string{
		"", "null", "{}", "garbage",
		`{"shard":3,"epoch":1,"log":"l","seq":5,"sig":"07070707070707070707070707070707"}`,
		`{"shard":3,"epoch":1,"log":"l","seq":"-5","sig":"07070707070707070707070707070707"}`,
		`{"shard":3,"epoch":1,"log":"l","seq":"99999999999999999999","sig":"07070707070707070707070707070707"}`,
		`{"shard":3,"epoch":1,"log":"l","seq":"5","sig":"0707"}`,
		`{"shard":3,"epoch":1,"log":"l","seq":"5","sig":"0707070707070707070707070707070G"}`,
		`{"shard":3,"epoch":1,"log":"l","seq":"5","sig":"07070707070707070707070707070707AA"}`,
		`{"shard":"3","epoch":1,"log":"l","seq":"5","sig":"07070707070707070707070707070707"}`,
		`{"shard":3,"epoch":70000,"log":"l","seq":"5","sig":"07070707070707070707070707070707"}`,
		`{"shard":3,"epoch":1,"log":"a.b","seq":"5","sig":"07070707070707070707070707070707"}`,
	} {
		if c, ok := UnmarshalCursor([]byte(bad)); ok {
			t.Errorf("%q read as %+v", bad, c)
		}
	}
}

func TestStoresRoundTrip(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "cursor.json")
	c := Cursor{Token: Token{Shard: 1, Epoch: 2, Log: "L", Sig: sig7}, Seq: math.MaxUint64}
	for name, s := range map[string]CursorStore{"memory": NewMemoryStore(), "file": NewFileStore(path), "file+sync": &FileStore{Path: path + "2", Sync: true}} {
		if got, err := s.Load(ctx); got != nil || err != nil {
			t.Fatalf("%s: empty store loads %+v %v", name, got, err)
		}
		if err := s.Save(ctx, c); err != nil {
			t.Fatal(err)
		}
		c2 := c
		c2.Seq = 7
		if err := s.Save(ctx, c2); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Load(ctx); err != nil || got == nil || !reflect.DeepEqual(*got, c2) {
			t.Fatalf("%s: %+v %v", name, got, err)
		}
		if err := s.Clear(ctx); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Load(ctx); got != nil || err != nil {
			t.Fatalf("%s: cleared store loads %+v %v", name, got, err)
		}
		if err := s.Clear(ctx); err != nil {
			t.Fatalf("%s: clearing twice: %v", name, err)
		}
	}
	// no temporary file is left behind; a file that does not read is a fresh start
	entries, _ := os.ReadDir(filepath.Dir(path))
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
	if err := os.WriteFile(path, []byte("{half"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := NewFileStore(path).Load(ctx); got != nil || err != nil {
		t.Fatalf("garbage loads %+v %v", got, err)
	}
}

// The file a FileStore writes is read by client/cursor-store.ts's deserializeCursor (run when the
// repository's node and tsx, which npm test provides).
func TestCursorFileReadableByTSSDK(t *testing.T) {
	root, _ := filepath.Abs("../..")
	tsx := filepath.Join(root, "node_modules", ".bin", "tsx")
	if _, err := os.Stat(filepath.Join(root, "client", "cursor-store.ts")); err != nil {
		t.Fatalf("client/cursor-store.ts not found under %s: the SDK's tests run inside the jetgate repository", root)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("no node on PATH: the cross-SDK cursor test runs the TypeScript SDK (npm test puts node on PATH)")
	}
	if _, err := os.Stat(tsx); err != nil {
		t.Fatal("no node_modules/.bin/tsx: run npm ci first")
	}
	path := filepath.Join(t.TempDir(), "cursor.json")
	c := Cursor{Token: Token{Shard: 4_000_000_000, Epoch: 65535, Log: "log_A-9", Sig: []byte{0, 1, 2, 0xfe, 0xff, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}, Seq: math.MaxUint64 - 1}
	if err := NewFileStore(path).Save(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	script := `import { readFileSync } from "node:fs";
import { deserializeCursor } from "` + filepath.ToSlash(filepath.Join(root, "client", "cursor-store.ts")) + `";
const c = deserializeCursor(readFileSync(process.argv[2], "utf8"));
if (!c) { console.log("undefined"); process.exit(0); }
console.log([c.shard, c.epoch, c.log, c.seq.toString(), Buffer.from(c.sig).toString("hex")].join(" "));`
	scriptPath := filepath.Join(t.TempDir(), "read.ts")
	if err := os.WriteFile(scriptPath, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tsx, scriptPath, path)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tsx: %v\n%s", err, out)
	}
	want := "4000000000 65535 log_A-9 18446744073709551614 000102feff05060708090a0b0c0d0e0f"
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("deserializeCursor read %q, want %q", got, want)
	}
}
