/**
 * The node (V8) flags a gateway runs with: in the image (Dockerfile), the chart
 * (`gateway.nodeArgs`), `npm start` and the test harness and benchmark; a test checks that the
 * image and the chart carry exactly these.
 *
 * Chosen by measurement (bench/RESULTS.md, "Issue 51"; docs/performance.md, "V8 for the gateway"):
 * with Node 24's defaults V8 grows the young generation during a connect burst and keeps it
 * committed, 7.5 KiB of heap per idle connection for 2.6 KiB live. Semi-spaces of 1 MiB hold that
 * to 1.9 KiB and the gateway's RSS from 9.7 to 6.7 KiB per connection (394 -> 292 MB at 18,000),
 * with `storm` and `fanout` within their run-to-run spread. `--optimize-for-size` got to 2.7 KiB
 * but made a reconnect storm 3.4-4.7 times as long and fanout 9-13% slower.
 */
export const GATEWAY_NODE_FLAGS: readonly string[] = ["--max-semi-space-size=1"];
