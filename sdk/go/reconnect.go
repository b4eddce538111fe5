package jetgate

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"strings"
	"time"
)

// Backoff is the reconnect backoff: exponential with full jitter. The delay before attempt n
// (0 first) is uniformly random in [0, min(Cap, Base * 2^n)] (protocol/backoff.ts).
type Backoff struct {
	Base time.Duration
	Cap  time.Duration
}

// DefaultBackoff is 250 ms doubling up to 30 s, as the TS SDK's.
var DefaultBackoff = Backoff{Base: 250 * time.Millisecond, Cap: 30 * time.Second}

// Ceiling is the upper bound of attempt's delay: min(Cap, Base * 2^attempt).
func (b Backoff) Ceiling(attempt int) time.Duration {
	if attempt < 0 {
		attempt = 0
	}
	// in floating point: Base * 2^30 overflows a Duration for a Base of 9 s and more
	c := float64(b.Base) * math.Pow(2, float64(min(attempt, 30)))
	if c >= float64(b.Cap) {
		return b.Cap
	}
	return time.Duration(c)
}

// Delay is the wait before attempt, given a uniform random number in [0, 1).
func (b Backoff) Delay(attempt int, random float64) time.Duration {
	return time.Duration(random * float64(b.Ceiling(attempt)))
}

// reconnector counts attempts since the last SYNCED or the last session that applied an entry
// (which also picks the gateway of a URL list) and hands out the next delay; a GOAWAY's or an
// UNAVAILABLE's retry_ms, or a reconnect the backend asked for, replaces the next delay once
// (client/reconnect.ts).
type reconnector struct {
	backoff  Backoff
	random   func() float64
	attempt  int
	override *time.Duration
}

func (r *reconnector) next() (attempt int, delay time.Duration) {
	if r.override != nil {
		delay = *r.override
	} else {
		delay = r.backoff.Delay(r.attempt, r.random())
	}
	r.override = nil
	attempt = r.attempt
	r.attempt++
	return attempt, delay
}

// reset: synced, or the session that ended applied entries; the next failure starts from the
// first step.
func (r *reconnector) reset() { r.attempt = 0 }

// retryAfter: the server named when to come back.
func (r *reconnector) retryAfter(d time.Duration) { r.override = &d }

// now: at once, and from the first step if that fails.
func (r *reconnector) now() {
	r.attempt = 0
	zero := time.Duration(0)
	r.override = &zero
}

// policy is what a device does after a close.
type policy int

const (
	policyBackoff policy = iota
	policyNow
	policyStop
)

// policyFor decides by the close code's range (protocol/errors.ts reconnectPolicy): 4300-4399 at
// once; 4600-4699 stop (so a terminal code this SDK does not know still stops it); 4403 and 4409
// stop (wire v1's two terminal codes, older than the ranges); every other code after the backoff.
func policyFor(code int) policy {
	switch {
	case code >= 4300 && code <= 4399:
		return policyNow
	case code >= 4600 && code <= 4699, code == CloseSignedOut, code == CloseReplaced:
		return policyStop
	}
	return policyBackoff
}

// refreshDelay is when to refresh a token with left to live: after three quarters of it, never
// sooner than a second. A fraction of what is left, not "a minute before expiry", which with
// tokens of a minute or less asked for a refresh every second.
func refreshDelay(left time.Duration) time.Duration {
	ms := max(1000, int64(math.Floor(float64(left.Milliseconds())*0.75)))
	return time.Duration(min(ms, math.MaxInt32)) * time.Millisecond
}

// tokenExpiry reads a JWT's exp without verifying it (only to time a refresh); ok is false when
// the token does not read.
func tokenExpiry(jwt string) (exp time.Time, ok bool) {
	parts := strings.Split(jwt, ".")
	if len(parts) < 2 {
		return time.Time{}, false
	}
	// base64url without padding, as JWTs are; the standard alphabet and padding are taken too
	p := strings.TrimRight(parts[1], "=")
	p = strings.NewReplacer("+", "-", "/", "_").Replace(p)
	raw, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *float64 `json:"exp"`
	}
	if json.Unmarshal(raw, &claims) != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	return time.UnixMilli(int64(*claims.Exp * 1000)), true
}
