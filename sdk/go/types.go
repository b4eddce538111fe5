package jetgate

import (
	"errors"
	"fmt"
	"time"
)

// Version is this SDK's version, reported by the conformance driver.
const Version = "0.1.0"

// ProtocolVersion is the wire protocol this SDK speaks (AUTH's `v`).
const ProtocolVersion = 1

// Limits of wire protocol v1 (protocol/frames.ts).
const (
	// MaxBodyBytes is the largest entry or SEND body.
	MaxBodyBytes = 256 * 1024
	// MaxTokenLength is the largest device JWT, in characters.
	MaxTokenLength = 8192
	// MaxLanes is how many lanes AUTH may name.
	MaxLanes = 32
	// CursorSigBytes is the length of a cursor signature.
	CursorSigBytes = 16
)

// Token is a cursor token as the gateway issues it: a position's numbering (shard, epoch, log)
// and the server's signature over it. Devices never verify it; they hand it back.
type Token struct {
	Shard uint32
	Epoch uint16
	Log   string
	Sig   []byte
}

// Cursor is what a device resumes with: a token plus the last applied seq in the token's
// numbering.
type Cursor struct {
	Token
	Seq uint64
}

// Entry is one mailbox entry as the app's handler receives it.
type Entry struct {
	// Seq is the entry's mailbox_seq (epoch << 48 | offset).
	Seq uint64
	// ID is the message id: what the SDK dedups by.
	ID   string
	Lane string
	// Prev is the previous seq in the same lane; nil when the server could not know it.
	Prev *uint64
	// TS is the entry's time in milliseconds since the Unix epoch.
	TS int64
	// Body is the entry's payload.
	Body []byte
	// Shard is the shard whose MSGS frame carried the entry.
	Shard uint32
}

// OldRange is one split hop of a CURSOR_REBASED: the entries of Shard with seq in (After, Until],
// in that shard's numbering; Cursor is that shard's token when the gateway sent one.
type OldRange struct {
	Shard  uint32
	After  uint64
	Until  uint64
	Cursor *Token
}

// ErrorFrame is an ERROR frame from the gateway; optional fields are nil when absent.
type ErrorFrame struct {
	Code            string
	Msg             string
	Fatal           bool
	ID              *uint32
	NewCursor       *Token
	ReplayFromSeq   *uint64
	OldRanges       []OldRange
	OldRange        *OldRange
	TrimWatermark   *uint64
	RebuildRequired *bool
	RetryMs         *int64
}

// Error codes carried in ERROR frames (protocol/errors.ts).
const (
	CodeCursorRebased = "CURSOR_REBASED"
	CodeCursorExpired = "CURSOR_EXPIRED"
	CodeCursorInvalid = "CURSOR_INVALID"
	CodeBadFrame      = "BAD_FRAME"
	CodeUnauthorized  = "UNAUTHORIZED"
	CodeRateLimited   = "RATE_LIMITED"
	CodeTooLarge      = "TOO_LARGE"
	CodeBadRequest    = "BAD_REQUEST"
	CodeUnavailable   = "UNAVAILABLE"
	CodeInternal      = "INTERNAL"
)

// Close codes of wire protocol v1: the gateway's, then the device's own (4000..4099).
const (
	CloseReconnectNow   = 4300
	CloseBadFrame       = 4400
	CloseUnauthenticate = 4401
	CloseSignedOut      = 4403
	CloseSlowConsumer   = 4408
	CloseReplaced       = 4409
	CloseTooLarge       = 4413
	CloseRateLimited    = 4429
	CloseInternal       = 4500
	CloseUnavailable    = 4503
	CloseGoingAway      = 1001

	CloseBye             = 1000
	CloseClientReconnect = 4000
	CloseHeartbeatMissed = 4001
	CloseBadServerFrame  = 4002
	CloseConnectTimeout  = 4003
	// CloseAbnormal is what the SDK reports when a socket ended without a close frame, or could
	// not be opened at all.
	CloseAbnormal = 1006
)

// StateType names the client's state.
type StateType string

// The client's states, as client/events.ts names them.
const (
	StateIdle       StateType = "idle"
	StateConnecting StateType = "connecting"
	StateSyncing    StateType = "syncing"
	StateLive       StateType = "live"
	StateWaiting    StateType = "waiting"
	StateClosed     StateType = "closed"
)

// State is the client's state: its type and, where the type has them, the attempt number, the
// wait before the next attempt, or the reason it closed.
type State struct {
	Type    StateType
	Attempt int
	Delay   time.Duration
	Reason  string
}

// EventType names an Event.
type EventType string

// The events the client tells the app through Options.OnEvent.
const (
	// EventState: the state changed (State).
	EventState EventType = "state"
	// EventSynced: SYNCED was applied, the device is caught up (Seq: the last applied seq).
	EventSynced EventType = "synced"
	// EventRebased: a CURSOR_REBASED was applied (Seq: replay_from_seq, Token: the new token).
	EventRebased EventType = "rebased"
	// EventCursorInvalid: CURSOR_INVALID, the stored cursor was dropped (Reason).
	EventCursorInvalid EventType = "cursor_invalid"
	// EventSignedOut: close 4403; the client stopped and will not reconnect (Reason).
	EventSignedOut EventType = "signed_out"
	// EventReconnectRequested: close 4300-4399; the client reconnects at once (Reason).
	EventReconnectRequested EventType = "reconnect_requested"
	// EventHandlerError: OnEntry returned an error; the entry comes again (Entry, Err).
	EventHandlerError EventType = "handler_error"
	// EventRebuildError: OnRebuild returned an error; it runs again after a backoff (Err).
	EventRebuildError EventType = "rebuild_error"
	// EventError: an ERROR frame arrived (Frame).
	EventError EventType = "error"
	// EventClosed: the socket closed or could not be opened (Code, Reason).
	EventClosed EventType = "closed"
	// EventGoaway: the gateway drains; the next reconnect waits Delay.
	EventGoaway EventType = "goaway"
	// EventCursorSaved: the store saved the cursor (Seq, Token).
	EventCursorSaved EventType = "cursor_saved"
	// EventCursorCleared: the store dropped the cursor (after CURSOR_INVALID).
	EventCursorCleared EventType = "cursor_cleared"
	// EventStoreError: the store failed to save or clear (Err); the client goes on.
	EventStoreError EventType = "store_error"
)

// Event is what the client tells the app. Which fields are set depends on Type (see each
// EventType).
type Event struct {
	Type   EventType
	State  State
	Seq    uint64
	Token  *Token
	Reason string
	Code   int
	Delay  time.Duration
	Entry  *Entry
	Frame  *ErrorFrame
	Err    error
}

// Stats are the client's counters (client/events.ts's ClientStats).
type Stats struct {
	Applied           int
	DuplicatesDropped int
	GapsFilled        int
	Reconnects        int
	Rebases           int
	// CursorInvalid counts CURSOR_INVALID answers: each one replays the mailbox from its start.
	CursorInvalid int
	HandlerErrors int
	// MailboxSeqRegressionCount must stay 0: an entry at or below the last applied, not applied.
	MailboxSeqRegressionCount int
}

var (
	// ErrClosed: the client was closed by the app (a pending Send, a Send after Close).
	ErrClosed = errors.New("jetgate: client closed")
	// ErrSignedOut matches the *CloseError of close 4403: the backend signed the user or
	// device out; sign in again and start a new client.
	ErrSignedOut = errors.New("jetgate: signed out")
	// ErrReplaced matches the *CloseError of close 4409: a newer session of this device
	// replaced this one.
	ErrReplaced = errors.New("jetgate: replaced by a newer session of this device")
)

// CloseError is why the client stopped for good: the gateway closed with a code that means "do
// not reconnect" (4403, 4409, 4600-4699).
type CloseError struct {
	Code   int
	Reason string
}

func (e *CloseError) Error() string {
	switch e.Code {
	case CloseSignedOut:
		return fmt.Sprintf("jetgate: signed out: %s", e.Reason)
	case CloseReplaced:
		return "jetgate: a newer session of this device replaced this one"
	}
	return fmt.Sprintf("jetgate: server closed with %d: %s", e.Code, e.Reason)
}

// Is makes errors.Is(err, ErrSignedOut) and errors.Is(err, ErrReplaced) work.
func (e *CloseError) Is(target error) bool {
	return (target == ErrSignedOut && e.Code == CloseSignedOut) || (target == ErrReplaced && e.Code == CloseReplaced)
}

// ServerError is an ERROR frame that refused a request (a SEND over the size limit).
type ServerError struct {
	Code string
	Msg  string
}

func (e *ServerError) Error() string { return fmt.Sprintf("jetgate: %s: %s", e.Code, e.Msg) }
