// Package jetgate is the Go device SDK of jetgate: one WebSocket to a gateway that keeps a
// device's view of its user's mailbox current. It is a port of the TypeScript SDK (client/ in the
// jetgate repository) and speaks wire protocol v1 (docs/protocol.md).
//
// Guarantees to the app (as client/client.ts states them):
//
//   - OnEntry is called once per message id within the dedup window, in increasing seq order, one
//     entry at a time; the cursor advances (and is saved) only after the handler returned nil. A
//     handler that returns an error gets the same entry again after a backoff (100 ms doubling to
//     5 s, full jitter); nothing after it is applied meanwhile.
//   - A cursor that no longer fits the server (epoch change, rebuilt log, split, retention) is
//     handled as the server says (docs/design.md, "Cursor cases"): rebase and dedup; after a split
//     each old shard's range in order (one per hop), then the new shard; OnRebuild before any later
//     entry on CURSOR_EXPIRED; a fresh start on CURSOR_INVALID.
//   - The stored cursor's token and seq always share one numbering: during a split's ranges the
//     token is the range's shard's, so a connection lost inside a range resumes it.
//
// The client reconnects by itself (exponential backoff with full jitter, several gateways in
// turn) until Close, or until the gateway closes with a code that means stop (4403 signed out,
// 4409 replaced, 4600-4699). Close returns after every goroutine of the client has ended.
package jetgate
