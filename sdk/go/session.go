package jetgate

// The connection: attempts, one session per socket (AUTH, frames, heartbeat, ACK timer, token
// refresh), and what a close means (client/client.ts, client/reconnect.ts).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// run is the connection loop: attempt, then wait or stop as the close asks, until the client ends.
func (c *Client) run() {
	defer c.wg.Done()
	// a terminal close ends the applier too
	defer c.cancel()
	for c.ctx.Err() == nil {
		end := c.attempt()
		if end.appClosed || c.ctx.Err() != nil {
			return
		}
		if end.socket {
			c.emit(Event{Type: EventClosed, Code: end.code, Reason: end.reason})
			switch policyFor(end.code) {
			case policyStop:
				c.stopFor(end.code, end.reason)
				return
			case policyNow:
				c.emit(Event{Type: EventReconnectRequested, Reason: end.reason})
				c.mu.Lock()
				c.reco.now()
				c.mu.Unlock()
			}
		}
		c.mu.Lock()
		if end.progressed {
			// the session applied entries: a close after progress (a 4408 that cuts off each
			// catch-up of a device too slow for it) starts the backoff over, as SYNCED does
			c.reco.reset()
		}
		attempt, delay := c.reco.next()
		c.stats.Reconnects++
		c.mu.Unlock()
		c.setState(State{Type: StateWaiting, Attempt: attempt, Delay: delay})
		if !c.wait(delay, nil) {
			return
		}
	}
}

// stopFor stops the client for good after a terminal close code.
func (c *Client) stopFor(code int, reason string) {
	err := &CloseError{Code: code, Reason: reason}
	stateReason := fmt.Sprintf("server closed with %d", code)
	if code == CloseSignedOut {
		c.emit(Event{Type: EventSignedOut, Reason: reason})
		stateReason = "signed out: " + reason
	}
	c.setClosed(stateReason, err)
	c.rejectSends(err)
}

// sessionEnd is how an attempt ended.
type sessionEnd struct {
	// socket: a socket was opened or tried, and its close is told (EventClosed) and obeyed.
	socket bool
	// appClosed: Close ended it.
	appClosed bool
	// byDevice: the device closed the socket itself, with code.
	byDevice bool
	code     int
	reason   string
	// progressed: the app applied an entry of the session (the cursor moved).
	progressed bool
}

func deviceClose(code int, reason string) sessionEnd {
	return sessionEnd{socket: true, byDevice: true, code: code, reason: reason}
}

// attempt makes one connection attempt and runs its session to the end.
func (c *Client) attempt() sessionEnd {
	c.mu.Lock()
	attempt := c.reco.attempt
	c.mu.Unlock()
	c.setState(State{Type: StateConnecting, Attempt: attempt})
	// The entry in the app's hands finishes first: the AUTH cursor must be where applying stopped.
	if !c.waitApplyIdle() {
		return sessionEnd{appClosed: true}
	}
	deadline := time.Now().Add(c.opts.ConnectTimeout)
	token, err := c.connectToken(deadline)
	if c.ctx.Err() != nil {
		return sessionEnd{appClosed: true}
	}
	if err != nil {
		// no socket for this attempt: straight to the backoff
		return sessionEnd{}
	}
	c.mu.Lock()
	url := c.opts.URLs[(c.urlBase+c.reco.attempt)%len(c.opts.URLs)]
	c.mu.Unlock()
	conn, raw, err := c.dial(deadline, url)
	if c.ctx.Err() != nil {
		return sessionEnd{appClosed: true}
	}
	if err != nil {
		if !time.Now().Before(deadline) {
			return deviceClose(CloseConnectTimeout, "no AUTH_OK in time")
		}
		return sessionEnd{socket: true, code: CloseAbnormal, reason: err.Error()}
	}
	return c.runSession(conn, raw, token, deadline)
}

// connectToken asks the app for a token, bounded by the attempt's deadline: a callback that never
// answers must not hold the client in connecting for good.
func (c *Client) connectToken(deadline time.Time) (string, error) {
	ctx, cancel := context.WithDeadline(c.ctx, deadline)
	defer cancel()
	got := make(chan tokenResult, 1)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t, err := c.opts.Token(ctx)
		got <- tokenResult{token: t, err: err}
	}()
	select {
	case r := <-got:
		return r.token, checkToken(r)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

type tokenResult struct {
	token string
	err   error
}

func checkToken(r tokenResult) error {
	if r.err != nil {
		return r.err
	}
	if len(r.token) == 0 || len(r.token) > MaxTokenLength {
		return fmt.Errorf("jetgate: a token has 1..%d characters", MaxTokenLength)
	}
	return nil
}

// rawConn is the TCP connection under a WebSocket: cutting it ends a close handshake that a dead
// link would hold for seconds (the library waits up to 5 s for each side of it).
type rawConn struct {
	mu   sync.Mutex
	conn net.Conn
}

func (r *rawConn) set(c net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conn = c
}

func (r *rawConn) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil {
		_ = r.conn.Close()
	}
}

// dial opens a WebSocket to url, on a transport of its own (no idle connections outlive it, and
// the TCP connection is known for rawConn).
func (c *Client) dial(deadline time.Time, url string) (*websocket.Conn, *rawConn, error) {
	raw := &rawConn{}
	dialer := &net.Dialer{}
	tr := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, network, addr)
			if err == nil {
				raw.set(conn)
			}
			return conn, err
		},
		TLSClientConfig:   c.opts.TLSConfig,
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithDeadline(c.ctx, deadline)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		raw.close()
		return nil, nil, err
	}
	conn.SetReadLimit(c.opts.MaxFrameBytes)
	return conn, raw, nil
}

// session is one socket from AUTH to its close.
type session struct {
	c    *Client
	conn *websocket.Conn
	raw  *rawConn
	// ctx ends with the session (for the token callback of a refresh).
	ctx    context.Context
	cancel context.CancelFunc
	// done is closed when the session ended: pulls are lost, the applier stops its entries.
	done chan struct{}
	born time.Time
	// lastHeard: nanoseconds after born when the last frame came.
	lastHeard atomic.Int64
	// authed (under c.mu): AUTH_OK came, requests may be written.
	authed bool
	// progressed: an entry of this session was applied (set before the cursor moves).
	progressed atomic.Bool

	mu      sync.Mutex
	ended   bool
	pulls   map[uint32]chan pullReply
	unacked int

	ackKick   chan struct{}
	reconnect chan struct{}
}

type pullReply struct {
	entries []Entry
	more    bool
	lost    bool
}

// inbound is what the reader hands the session loop: a frame, a frame that does not decode, or
// the end of the socket.
type inbound struct {
	frame     *serverFrame
	bad       error
	ended     bool
	endCode   int
	endReason string
}

func (s *session) heard() { s.lastHeard.Store(int64(time.Since(s.born))) }

func (s *session) silentFor() time.Duration {
	return time.Since(s.born) - time.Duration(s.lastHeard.Load())
}

func (s *session) isDone() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (s *session) write(b []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.c.tune.writeTimeout)
	defer cancel()
	return s.conn.Write(ctx, websocket.MessageBinary, b)
}

func (s *session) requestReconnect() {
	select {
	case s.reconnect <- struct{}{}:
	default:
	}
}

// count: one more entry behind the cursor, towards the next cumulative ACK.
func (s *session) count() {
	s.mu.Lock()
	s.unacked++
	n := s.unacked
	s.mu.Unlock()
	if n >= s.c.opts.AckEvery.Entries {
		s.flushAck()
		return
	}
	if n == 1 {
		select {
		case s.ackKick <- struct{}{}:
		default:
		}
	}
}

// flushAck sends ACK of the last applied seq if anything was applied since the last one.
func (s *session) flushAck() {
	s.mu.Lock()
	n := s.unacked
	s.unacked = 0
	s.mu.Unlock()
	if n == 0 {
		return
	}
	_ = s.write(encodeAck(s.c.CursorSeq()))
}

// pull asks for the entries after `after`; ok is false when the connection went before the answer.
func (s *session) pull(after uint64) (pullReply, bool) {
	c := s.c
	c.mu.Lock()
	id := c.requestIDLocked()
	c.mu.Unlock()
	ch := make(chan pullReply, 1)
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return pullReply{}, false
	}
	s.pulls[id] = ch
	s.mu.Unlock()
	if err := s.write(encodePull(id, after, c.tune.pullLimit)); err != nil {
		s.takePull(id)
		return pullReply{}, false
	}
	select {
	case r := <-ch:
		return r, !r.lost
	case <-s.done:
		return pullReply{}, false
	case <-c.ctx.Done():
		return pullReply{}, false
	}
}

func (s *session) takePull(id uint32) chan pullReply {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.pulls[id]
	delete(s.pulls, id)
	return ch
}

// read hands every frame to the session loop until the socket ends.
func (s *session) read(out chan<- inbound) {
	defer s.c.wg.Done()
	for {
		// no ctx deadline: a done ctx would make the library drop the socket without a close frame
		typ, data, err := s.conn.Read(context.Background())
		var in inbound
		switch {
		case err != nil:
			in = inbound{ended: true, endCode: CloseAbnormal, endReason: err.Error()}
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				in.endCode, in.endReason = int(ce.Code), ce.Reason
			}
		case typ != websocket.MessageBinary:
			s.heard()
			in.bad = badFrame("frames must be binary msgpack")
		default:
			s.heard()
			in.frame, in.bad = decodeServerFrame(data)
		}
		select {
		case out <- in:
		case <-s.done:
			return
		}
		if in.ended {
			return
		}
	}
}

// runSession runs one socket: AUTH, then every frame, timer and request until it ends.
func (c *Client) runSession(conn *websocket.Conn, raw *rawConn, token string, deadline time.Time) sessionEnd {
	s := &session{
		c:         c,
		conn:      conn,
		raw:       raw,
		done:      make(chan struct{}),
		born:      time.Now(),
		pulls:     make(map[uint32]chan pullReply),
		ackKick:   make(chan struct{}, 1),
		reconnect: make(chan struct{}, 1),
	}
	s.ctx, s.cancel = context.WithCancel(c.ctx)
	c.mu.Lock()
	c.sess = s
	c.sessionToken = token
	cursor := c.pos.cursor()
	c.mu.Unlock()
	frames := make(chan inbound)
	c.wg.Add(1)
	go s.read(frames)
	s.heard()
	l := &sessionLoop{s: s, c: c, tokens: make(chan tokenResult)}
	end := l.run(frames, encodeAuth(token, c.opts.Device, cursor, c.opts.Lanes), deadline)
	l.stopTimers()
	c.endSession(s, end)
	end.progressed = s.progressed.Load()
	return end
}

// endSession forgets what the session delivered and the app has not applied (it comes again
// after the cursor), loses its pulls and closes its socket.
func (c *Client) endSession(s *session, end sessionEnd) {
	c.mu.Lock()
	c.sess = nil
	c.queue = nil
	c.pos.connectionLost()
	c.mu.Unlock()
	s.mu.Lock()
	s.ended = true
	s.pulls = nil
	s.mu.Unlock()
	close(s.done)
	s.cancel()
	closed := make(chan struct{})
	c.wg.Add(2)
	go func() {
		defer c.wg.Done()
		defer close(closed)
		if end.byDevice || end.appClosed {
			_ = s.conn.Close(websocket.StatusCode(end.code), end.reason)
		} else {
			_ = s.conn.CloseNow()
		}
	}()
	go func() {
		defer c.wg.Done()
		t := time.NewTimer(c.tune.closeGrace)
		defer t.Stop()
		select {
		case <-closed:
		case <-t.C:
			// the peer does not finish the close handshake: give the link up
			s.raw.close()
		}
	}()
}

// sessionLoop is the session's goroutine: it owns the timers.
type sessionLoop struct {
	s *session
	c *Client

	connect  *time.Timer
	connectC <-chan time.Time
	hb       *time.Ticker
	hbC      <-chan time.Time
	hbEvery  time.Duration
	ack      *time.Timer
	ackC     <-chan time.Time
	refresh  *time.Timer
	refreshC <-chan time.Time
	fetching bool
	tokens   chan tokenResult
}

func (l *sessionLoop) stopTimers() {
	for _, t := range []*time.Timer{l.connect, l.ack, l.refresh} {
		if t != nil {
			t.Stop()
		}
	}
	if l.hb != nil {
		l.hb.Stop()
	}
}

func (l *sessionLoop) run(frames <-chan inbound, auth []byte, deadline time.Time) sessionEnd {
	s, c := l.s, l.c
	l.connect = time.NewTimer(time.Until(deadline))
	l.connectC = l.connect.C
	if err := s.write(auth); err != nil {
		return sessionEnd{socket: true, code: CloseAbnormal, reason: err.Error()}
	}
	for {
		select {
		case <-c.ctx.Done():
			// the app closes: the entry in its hands finishes (its cursor saved), a last ACK, then
			// the close frame
			c.waitApplyIdleFor(c.tune.closeGrace)
			s.flushAck()
			return sessionEnd{socket: true, appClosed: true, code: CloseBye, reason: "bye"}
		case in := <-frames:
			if in.ended {
				return sessionEnd{socket: true, code: in.endCode, reason: in.endReason}
			}
			if in.bad != nil {
				return deviceClose(CloseBadServerFrame, "bad frame from server")
			}
			if end, stop := l.handle(in.frame); stop {
				return end
			}
		case <-l.connectC:
			return deviceClose(CloseConnectTimeout, "no AUTH_OK in time")
		case <-l.hbC:
			// no frame for 2 x hb + grace: a dead link, given up at once rather than after its
			// close handshake
			if s.silentFor() > 2*l.hbEvery+c.tune.heartbeatGrace {
				return deviceClose(CloseHeartbeatMissed, "heartbeat missed")
			}
			_ = s.write(encodePing())
		case <-s.ackKick:
			if l.ackC == nil {
				l.ack = time.NewTimer(c.opts.AckEvery.Interval)
				l.ackC = l.ack.C
			}
		case <-l.ackC:
			l.ackC = nil
			s.flushAck()
		case <-l.refreshC:
			l.refreshC = nil
			l.fetchToken()
		case r := <-l.tokens:
			l.fetching = false
			if checkToken(r) != nil {
				// tried again later; at expiry the gateway closes and the reconnect asks again
				l.scheduleRefreshIn(c.tune.refreshRetry)
				continue
			}
			c.mu.Lock()
			c.sessionToken = r.token
			c.mu.Unlock()
			_ = s.write(encodeRefresh(r.token))
		case <-s.reconnect:
			return deviceClose(CloseClientReconnect, "client reconnect")
		}
	}
}

// fetchToken asks the app for a token for REFRESH, off the loop.
func (l *sessionLoop) fetchToken() {
	if l.fetching {
		return
	}
	l.fetching = true
	s, c := l.s, l.c
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t, err := c.opts.Token(s.ctx)
		select {
		case l.tokens <- tokenResult{token: t, err: err}:
		case <-s.done:
		}
	}()
}

func (l *sessionLoop) scheduleRefreshIn(d time.Duration) {
	if l.refresh != nil {
		l.refresh.Stop()
	}
	l.refresh = time.NewTimer(d)
	l.refreshC = l.refresh.C
}

// scheduleRefresh refreshes before exp (after three quarters of what is left).
func (l *sessionLoop) scheduleRefresh(exp time.Time) {
	l.scheduleRefreshIn(refreshDelay(time.Until(exp)))
}

// handle takes one frame; stop ends the session with end.
func (l *sessionLoop) handle(f *serverFrame) (end sessionEnd, stop bool) {
	s, c := l.s, l.c
	switch f.T {
	case "AUTH_OK":
		l.connect.Stop()
		l.connectC = nil
		c.mu.Lock()
		s.authed = true
		token := c.sessionToken
		c.mu.Unlock()
		// refreshed before the session's token expires, so the gateway does not close at expiry
		if exp, ok := tokenExpiry(token); ok {
			l.scheduleRefresh(exp)
		}
		// after a CURSOR_REBASED that came before it
		c.push(item{kind: itemAuthOK, sess: s, token: f.Cursor, seq: f.From})
		c.setState(State{Type: StateSyncing})
		if l.hb != nil {
			l.hb.Stop()
		}
		l.hbEvery = max(c.tune.minHeartbeat, time.Duration(f.HB)*time.Millisecond)
		l.hb = time.NewTicker(l.hbEvery)
		l.hbC = l.hb.C
		for _, p := range c.pendingSends() {
			_ = s.write(encodeSend(p.id, p.cmid, p.body))
		}
	case "ERROR":
		return l.onError(f.Error)
	case "MSGS":
		if f.HasID {
			if ch := s.takePull(f.ID); ch != nil {
				ch <- pullReply{entries: f.Entries, more: f.More}
			}
			return sessionEnd{}, false
		}
		c.push(item{kind: itemEntries, sess: s, shard: f.Shard, entries: f.Entries})
	case "SYNCED":
		// the end of catch-up, in order with the entries before it
		c.push(item{kind: itemSynced, sess: s})
	case "SEND_OK":
		c.resolveSend(f.ID, sendResult{dup: f.Dup})
	case "GOAWAY":
		d := time.Duration(f.RetryMs) * time.Millisecond
		c.mu.Lock()
		c.reco.retryAfter(d)
		c.mu.Unlock()
		c.emit(Event{Type: EventGoaway, Reason: f.Reason, Delay: d})
	case "PONG":
	case "REFRESH_OK":
		l.scheduleRefresh(time.UnixMilli(f.Exp))
	}
	return sessionEnd{}, false
}

func (l *sessionLoop) onError(e *ErrorFrame) (sessionEnd, bool) {
	s, c := l.s, l.c
	c.emit(Event{Type: EventError, Frame: e})
	switch {
	case e.Code == CodeCursorRebased && e.NewCursor != nil && e.ReplayFromSeq != nil:
		// every hop in old_ranges; a gateway older than it sends the first hop alone in old_range
		ranges := e.OldRanges
		if len(ranges) == 0 && e.OldRange != nil {
			ranges = []OldRange{*e.OldRange}
		}
		c.push(item{kind: itemRebased, sess: s, token: *e.NewCursor, seq: *e.ReplayFromSeq, ranges: ranges})
		return sessionEnd{}, false
	case e.Code == CodeCursorExpired && e.NewCursor != nil:
		var trim uint64
		if e.TrimWatermark != nil {
			trim = *e.TrimWatermark
		}
		c.push(item{kind: itemExpired, sess: s, token: *e.NewCursor, seq: trim})
		return sessionEnd{}, false
	case e.Code == CodeCursorInvalid:
		c.push(item{kind: itemInvalid, sess: s, newToken: e.NewCursor, reason: e.Msg})
		return sessionEnd{}, false
	}
	if e.Fatal && e.RetryMs != nil {
		// UNAVAILABLE: the close (4503) that follows waits retry_ms, not the backoff
		c.mu.Lock()
		c.reco.retryAfter(time.Duration(*e.RetryMs) * time.Millisecond)
		c.mu.Unlock()
	}
	if e.ID == nil {
		return sessionEnd{}, false
	}
	id := *e.ID
	if ch := s.takePull(id); ch != nil {
		// A refused PULL leaves a gap this session cannot fill: the entry waits, and a new session
		// sends everything after the cursor.
		ch <- pullReply{lost: true}
		return deviceClose(CloseClientReconnect, "client reconnect"), true
	}
	c.mu.Lock()
	p, pending := c.sends[id]
	c.mu.Unlock()
	if !pending {
		return sessionEnd{}, false
	}
	switch e.Code {
	case CodeInternal:
		// written again, same id and cmid, a little later
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			if !c.wait(c.tune.sendRetry, s.done) {
				return
			}
			c.mu.Lock()
			_, still := c.sends[id]
			c.mu.Unlock()
			if still {
				_ = s.write(encodeSend(id, p.cmid, p.body))
			}
		}()
	case CodeTooLarge:
		c.resolveSend(id, sendResult{err: &ServerError{Code: e.Code, Msg: e.Msg}})
	}
	return sessionEnd{}, false
}
