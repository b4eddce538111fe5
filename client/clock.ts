/** Time as the SDK uses it: protocol/clock.ts's Clock, so tests can drive the heartbeat and the timers by hand. */
import { globalClock, type Clock, type TimerHandle } from "../protocol/device.js";

export { sleep, type Clock } from "../protocol/device.js";
export type Timer = TimerHandle;

/**
 * The SDK's default clock (ClientOptions.clock): the runtime's, with timers that keep a Node app
 * running, unlike protocol's systemClock: a Node app waiting to reconnect may have nothing else
 * holding its process up. `now` is the wall clock itself: a phone sleeps, and some browsers stop
 * `performance.now()` meanwhile, which would put a token's refresh (its `exp` is wall time) late.
 */
export const deviceClock: Clock = { ...globalClock({ unrefTimers: false }), now: () => Date.now() };
