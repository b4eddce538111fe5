package jetgate

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"slices"
	"sync"
	"time"
)

// AckPolicy says when the client sends a cumulative ACK of the last applied seq: after Entries
// applied entries or Interval, whichever comes first.
type AckPolicy struct {
	Entries  int
	Interval time.Duration
}

// Options configure a Client. URLs, Device, Token and OnEntry are required.
type Options struct {
	// URLs are gateway WebSocket URLs (ws://host:port/v1/ws). The client starts at a random one
	// and moves to the next after each failed attempt.
	URLs []string
	// Device is this device's id ([A-Za-z0-9_-], 1..64 characters).
	Device string
	// Token returns a fresh device JWT. It is called before every connection attempt (bounded by
	// ConnectTimeout) and before the session's token expires; it must return once ctx is done.
	Token func(ctx context.Context) (string, error)
	// OnEntry applies one entry. It is called once per message id within the dedup window, in
	// increasing seq order, one entry at a time; the cursor is saved only after it returned nil.
	// An error gives it the same entry again after a backoff. ctx is done when the client closes.
	OnEntry func(ctx context.Context, e Entry) error
	// OnRebuild is called on CURSOR_EXPIRED (entries were lost to retention): the app rebuilds its
	// state. Entries wait until it returned nil; an error runs it again after a backoff.
	OnRebuild func(ctx context.Context, trimWatermark uint64) error
	// OnEvent receives the client's events, one call at a time, in order. It must not block for
	// long, nor call Close.
	OnEvent func(Event)
	// Store keeps the cursor between runs; a MemoryStore when nil.
	Store CursorStore
	// Lanes are the lanes this device wants (1..32 lane ids); all lanes when empty.
	Lanes []string
	// DedupWindow is how many message ids are remembered for dedup (default 10,000).
	DedupWindow int
	// AckEvery: default 100 entries or 1 s.
	AckEvery AckPolicy
	// ConnectTimeout bounds one attempt, Token included, until AUTH_OK (default 10 s): an attempt
	// without AUTH_OK by then is given up (4003) and the next gateway tried.
	ConnectTimeout time.Duration
	// Backoff between attempts (default DefaultBackoff: 250 ms doubling to 30 s, full jitter).
	Backoff Backoff
	// TLSConfig is used for wss:// URLs; nil uses the system's roots.
	TLSConfig *tls.Config
	// MaxFrameBytes is the largest frame read from a gateway (default 64 MiB).
	MaxFrameBytes int64
}

// tuning holds the client's fixed timings; tests shorten them.
type tuning struct {
	minHeartbeat   time.Duration
	heartbeatGrace time.Duration
	handlerBackoff Backoff
	sendRetry      time.Duration
	refreshRetry   time.Duration
	closeGrace     time.Duration
	writeTimeout   time.Duration
	pullLimit      int
	maxGapRounds   int
	random         func() float64
}

func defaultTuning() tuning {
	return tuning{
		minHeartbeat:   time.Second,
		heartbeatGrace: 5 * time.Second,
		handlerBackoff: Backoff{Base: 100 * time.Millisecond, Cap: 5 * time.Second},
		sendRetry:      time.Second,
		refreshRetry:   5 * time.Second,
		closeGrace:     time.Second,
		writeTimeout:   10 * time.Second,
		pullLimit:      500,
		maxGapRounds:   100,
		random:         mathrand.Float64,
	}
}

// Client keeps one device's view of its mailbox current over a WebSocket to a gateway: it
// connects, resumes by cursor, applies entries through OnEntry and reconnects by itself until
// Close or a close code that means stop.
type Client struct {
	opts    Options
	tune    tuning
	urlBase int

	// ctx ends with the client (Close, or a terminal close); every goroutine watches it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{}

	closeOnce sync.Once
	// evMu serializes OnEvent calls; it is taken before mu, never while holding it.
	evMu sync.Mutex

	mu       sync.Mutex
	launched bool
	starting bool
	stopped  bool
	err      error
	state    State
	stats    Stats
	pos      position
	reco     reconnector
	sess     *session
	// sessionToken is the JWT the live session runs on (for its exp).
	sessionToken string
	sends        map[uint32]*pendingSend
	nextID       uint32
	queue        []item
	idle         bool
	idleCh       chan struct{}

	wake chan struct{}
	// recent is the applier's alone.
	recent *recentIDs
}

type pendingSend struct {
	id     uint32
	cmid   string
	body   []byte
	result chan sendResult
}

type sendResult struct {
	dup bool
	err error
}

// New checks opts and returns a client; Start (or Run) connects it.
func New(opts Options) (*Client, error) {
	return newClient(opts, defaultTuning())
}

func newClient(opts Options, tune tuning) (*Client, error) {
	if len(opts.URLs) == 0 {
		return nil, errors.New("jetgate: Options.URLs is empty")
	}
	if !validID(opts.Device, maxIDLength) {
		return nil, fmt.Errorf("jetgate: device %q is not an id of [A-Za-z0-9_-], 1..64 characters", opts.Device)
	}
	if opts.Token == nil || opts.OnEntry == nil {
		return nil, errors.New("jetgate: Options.Token and Options.OnEntry are required")
	}
	if len(opts.Lanes) > MaxLanes {
		return nil, fmt.Errorf("jetgate: at most %d lanes", MaxLanes)
	}
	for i, l := range opts.Lanes {
		if !validID(l, maxLaneLength) {
			return nil, fmt.Errorf("jetgate: lane %q is not an id of [A-Za-z0-9_-], 1..32 characters", l)
		}
		if slices.Contains(opts.Lanes[:i], l) {
			return nil, fmt.Errorf("jetgate: lane %q is named twice", l)
		}
	}
	opts.URLs = slices.Clone(opts.URLs)
	opts.Lanes = slices.Clone(opts.Lanes)
	if opts.Store == nil {
		opts.Store = NewMemoryStore()
	}
	if opts.DedupWindow <= 0 {
		opts.DedupWindow = 10_000
	}
	if opts.AckEvery.Entries <= 0 {
		opts.AckEvery.Entries = 100
	}
	if opts.AckEvery.Interval <= 0 {
		opts.AckEvery.Interval = time.Second
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	if opts.Backoff.Base <= 0 || opts.Backoff.Cap <= 0 {
		opts.Backoff = DefaultBackoff
	}
	if opts.MaxFrameBytes <= 0 {
		opts.MaxFrameBytes = 64 << 20
	}
	ctx, cancel := context.WithCancel(context.Background())
	idleCh := make(chan struct{})
	close(idleCh)
	return &Client{
		opts:    opts,
		tune:    tune,
		urlBase: int(tune.random() * 1024),
		ctx:     ctx,
		cancel:  cancel,
		done:    make(chan struct{}),
		state:   State{Type: StateIdle},
		reco:    reconnector{backoff: opts.Backoff, random: tune.random},
		sends:   make(map[uint32]*pendingSend),
		nextID:  1,
		idle:    true,
		idleCh:  idleCh,
		wake:    make(chan struct{}, 1),
		recent:  newRecentIDs(opts.DedupWindow),
	}, nil
}

// Start loads the stored cursor (ctx bounds the load only) and starts connecting in the
// background. The client runs until Close, or until the gateway closes with a code that means
// stop (Done and Err tell).
func (c *Client) Start(ctx context.Context) error {
	c.mu.Lock()
	if c.starting || c.launched || c.stopped {
		c.mu.Unlock()
		return errors.New("jetgate: a client starts once")
	}
	c.starting = true
	c.mu.Unlock()
	cur, err := c.opts.Store.Load(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starting = false
	if err != nil {
		return fmt.Errorf("jetgate: loading the cursor: %w", err)
	}
	if c.stopped {
		return ErrClosed
	}
	if cur != nil {
		c.pos.load(*cur)
	}
	c.launched = true
	c.wg.Add(2)
	go c.run()
	go c.applyLoop()
	go func() {
		c.wg.Wait()
		close(c.done)
	}()
	return nil
}

// Run starts the client and blocks until ctx is done (it then closes the client and returns
// ctx.Err()), Close is called (nil), or the gateway stopped the client (its *CloseError).
func (c *Client) Run(ctx context.Context) error {
	if err := c.Start(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		_ = c.Close()
		return ctx.Err()
	case <-c.done:
		return c.Err()
	}
}

// Close ends the client: the entry in the app's hands finishes (its ctx is done) and its cursor
// is saved, a final ACK and a close frame go out, pending sends fail with ErrClosed. It returns
// after every goroutine of the client has ended.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.setClosed("closed by the app", nil)
		c.mu.Lock()
		c.stopped = true
		launched := c.launched
		c.mu.Unlock()
		c.cancel()
		if !launched {
			close(c.done)
		}
	})
	<-c.done
	c.rejectSends(ErrClosed)
	return nil
}

// Done is closed once the client has stopped and every goroutine of it has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the client stopped by itself (a *CloseError: 4403, 4409, 4600-4699); nil while it
// runs and after Close.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// State is the client's state now.
func (c *Client) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// Stats returns a copy of the client's counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// CursorSeq is the last seq the app's handler finished.
func (c *Client) CursorSeq() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pos.seq
}

// Cursor is the cursor the next AUTH would carry (nil before the first token).
func (c *Client) Cursor() *Cursor {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pos.cursor()
}

// Disconnect drops the current connection (close 4000) and reconnects, e.g. after the app saw
// the network change.
func (c *Client) Disconnect() {
	c.mu.Lock()
	s := c.sess
	c.mu.Unlock()
	if s != nil {
		s.requestReconnect()
	}
}

// Send sends body upstream with the client message id cmid (a random one when empty) and returns
// once the gateway stored it; dup is true when the gateway had it already. A send waits across
// reconnects and is written again, with the same cmid, on each new connection, so a retry cannot
// duplicate. ctx bounds the wait only: a send already written may still be stored.
func (c *Client) Send(ctx context.Context, body []byte, cmid string) (dup bool, err error) {
	if cmid == "" {
		cmid = randomCmid()
	} else if !validID(cmid, maxIDLength) {
		return false, fmt.Errorf("jetgate: cmid %q is not an id of [A-Za-z0-9_-], 1..64 characters", cmid)
	}
	if len(body) > MaxBodyBytes {
		return false, &ServerError{Code: CodeTooLarge, Msg: fmt.Sprintf("body of %d bytes exceeds %d", len(body), MaxBodyBytes)}
	}
	// a copy: the app may reuse its buffer before the gateway answers
	p := &pendingSend{cmid: cmid, body: append([]byte{}, body...), result: make(chan sendResult, 1)}
	c.mu.Lock()
	if c.stopped {
		err := c.stopErrLocked()
		c.mu.Unlock()
		return false, err
	}
	p.id = c.requestIDLocked()
	c.sends[p.id] = p
	s := c.sess
	live := s != nil && s.authed
	c.mu.Unlock()
	if live {
		_ = s.write(encodeSend(p.id, p.cmid, p.body))
	}
	select {
	case r := <-p.result:
		return r.dup, r.err
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.sends, p.id)
		c.mu.Unlock()
		select {
		case r := <-p.result:
			return r.dup, r.err
		default:
			return false, ctx.Err()
		}
	}
}

func randomCmid() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	out := make([]byte, len(b))
	for i, x := range b {
		out[i] = digits[int(x)%len(digits)]
	}
	return string(out)
}

// requestIDLocked hands out PULL and SEND ids from one sequence (an ERROR's id names one request);
// they are u32 on the wire.
func (c *Client) requestIDLocked() uint32 {
	id := c.nextID
	c.nextID++
	if c.nextID == 0 {
		c.nextID = 1
	}
	return id
}

func (c *Client) stopErrLocked() error {
	if c.err != nil {
		return c.err
	}
	return ErrClosed
}

func (c *Client) resolveSend(id uint32, r sendResult) {
	c.mu.Lock()
	p, ok := c.sends[id]
	delete(c.sends, id)
	c.mu.Unlock()
	if ok {
		p.result <- r
	}
}

func (c *Client) rejectSends(err error) {
	c.mu.Lock()
	pending := c.sends
	c.sends = make(map[uint32]*pendingSend)
	c.mu.Unlock()
	for _, p := range pending {
		p.result <- sendResult{err: err}
	}
}

// pendingSends lists the sends waiting for SEND_OK, in the order they were made.
func (c *Client) pendingSends() []*pendingSend {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*pendingSend, 0, len(c.sends))
	for _, p := range c.sends {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *pendingSend) int { return int(int64(a.id) - int64(b.id)) })
	return out
}

// ---- events and state ----------------------------------------------------------------------

func (c *Client) callOnEvent(e Event) {
	if c.opts.OnEvent != nil {
		c.opts.OnEvent(e)
	}
}

func (c *Client) emit(e Event) {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	c.callOnEvent(e)
}

// setState changes the state and tells it; once closed, the state stays closed.
func (c *Client) setState(s State) {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	c.mu.Lock()
	if c.state.Type == StateClosed {
		c.mu.Unlock()
		return
	}
	c.state = s
	c.mu.Unlock()
	c.callOnEvent(Event{Type: EventState, State: s})
}

// setClosed moves to closed for good (once) and records err as why.
func (c *Client) setClosed(reason string, err error) bool {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	c.mu.Lock()
	if c.state.Type == StateClosed {
		c.mu.Unlock()
		return false
	}
	s := State{Type: StateClosed, Reason: reason}
	c.state = s
	c.stopped = true
	if err != nil {
		c.err = err
	}
	c.mu.Unlock()
	c.callOnEvent(Event{Type: EventState, State: s})
	return true
}

// wait sleeps d; false when the client or the given session (nil: none) ended first.
func (c *Client) wait(d time.Duration, sessionDone <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.ctx.Done():
		return false
	case <-sessionDone:
		return false
	}
}
