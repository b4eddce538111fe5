package jetgate

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
)

// CursorStore keeps a device's cursor between runs: the gateway's signed token plus the last
// applied seq. The client calls it from one goroutine at a time, in order.
type CursorStore interface {
	// Load returns the stored cursor, or nil when there is none (or it does not read: the device
	// then starts fresh).
	Load(ctx context.Context) (*Cursor, error)
	Save(ctx context.Context, c Cursor) error
	Clear(ctx context.Context) error
}

// cursorJSON is client/cursor-store.ts's JSON form, fields in its order: the seq as a decimal
// string (JSON numbers lose integers above 2^53), the signature as lowercase hex.
type cursorJSON struct {
	Shard uint32 `json:"shard"`
	Epoch uint16 `json:"epoch"`
	Log   string `json:"log"`
	Seq   string `json:"seq"`
	Sig   string `json:"sig"`
}

var seqPattern = regexp.MustCompile(`^[0-9]{1,20}$`)

// MarshalCursor writes a cursor in the JSON form of client/cursor-store.ts (serializeCursor), so a
// store file is readable by either SDK.
func MarshalCursor(c Cursor) []byte {
	b, _ := json.Marshal(cursorJSON{Shard: c.Shard, Epoch: c.Epoch, Log: c.Log, Seq: strconv.FormatUint(c.Seq, 10), Sig: hex.EncodeToString(c.Sig)})
	return b
}

// UnmarshalCursor reads the JSON form; ok is false for anything that does not read as a cursor a
// gateway would take (a device then starts fresh rather than being refused at every AUTH).
func UnmarshalCursor(b []byte) (c Cursor, ok bool) {
	var j cursorJSON
	if len(b) == 0 || json.Unmarshal(b, &j) != nil {
		return Cursor{}, false
	}
	if !validID(j.Log, maxIDLength) || !seqPattern.MatchString(j.Seq) {
		return Cursor{}, false
	}
	seq, err := strconv.ParseUint(j.Seq, 10, 64)
	if err != nil {
		return Cursor{}, false
	}
	sig, err := hex.DecodeString(j.Sig)
	if err != nil || len(sig) != CursorSigBytes || hex.EncodeToString(sig) != j.Sig {
		return Cursor{}, false
	}
	return Cursor{Token: Token{Shard: j.Shard, Epoch: j.Epoch, Log: j.Log, Sig: sig}, Seq: seq}, true
}

// MemoryStore keeps the cursor in memory (in its JSON form, as the TS MemoryCursorStore does).
type MemoryStore struct {
	mu    sync.Mutex
	value []byte
}

// NewMemoryStore returns an empty memory store.
func NewMemoryStore() *MemoryStore { return &MemoryStore{} }

func (s *MemoryStore) Load(context.Context) (*Cursor, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := UnmarshalCursor(s.value)
	if !ok {
		return nil, nil
	}
	return &c, nil
}

func (s *MemoryStore) Save(_ context.Context, c Cursor) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.value = MarshalCursor(c)
	return nil
}

func (s *MemoryStore) Clear(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.value = nil
	return nil
}

// FileStore keeps the cursor in a file, replaced atomically: written to a temporary file in the
// same directory, then renamed over it, so a crash leaves the old cursor or the new one.
type FileStore struct {
	Path string
	// Sync flushes the temporary file to disk before the rename: a power loss then cannot leave
	// an empty file. Off by default, as in the TS SDK (a lost cursor costs a replay, never an
	// entry), since it costs a disk flush per applied entry.
	Sync bool
}

// NewFileStore returns a store kept in the file at path.
func NewFileStore(path string) *FileStore { return &FileStore{Path: path} }

// Load returns nil, nil when the file is missing or does not read as a cursor.
func (s *FileStore) Load(context.Context) (*Cursor, error) {
	b, err := os.ReadFile(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	c, ok := UnmarshalCursor(b)
	if !ok {
		return nil, nil
	}
	return &c, nil
}

func (s *FileStore) Save(_ context.Context, c Cursor) error {
	dir := filepath.Dir(s.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(s.Path)+".tmp-*")
	if err != nil {
		return err
	}
	name := tmp.Name()
	_, err = tmp.Write(MarshalCursor(c))
	if err == nil && s.Sync {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(name, s.Path)
	}
	if err != nil {
		_ = os.Remove(name)
	}
	return err
}

func (s *FileStore) Clear(context.Context) error {
	err := os.Remove(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
