/** Bounded, named waits: every wait in the test suite has a deadline and says what it waited for. */

export class WaitTimeoutError extends Error {
  override readonly name = "WaitTimeoutError";
}

/** Thrown by a check to end the wait at once (the thing waited for can no longer happen). */
export class WaitAbort extends Error {
  override readonly name = "WaitAbort";
}

export interface WaitOptions {
  timeoutMs?: number;
  intervalMs?: number;
}

/**
 * Polls `check` until it returns a value other than undefined/false, or throws WaitTimeoutError
 * naming `what` and the last error `check` threw. A WaitAbort thrown by `check` ends it at once.
 */
export async function waitFor<T>(
  what: string,
  check: () => T | undefined | false | Promise<T | undefined | false>,
  { timeoutMs = 10_000, intervalMs = 50 }: WaitOptions = {},
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v !== undefined && v !== false) return v;
    } catch (err) {
      if (err instanceof WaitAbort) throw err;
      lastError = err;
    }
    if (Date.now() >= deadline) {
      const why = lastError instanceof Error ? `: last error: ${lastError.message}` : "";
      throw new WaitTimeoutError(`waiting for ${what} timed out after ${timeoutMs} ms${why}`, { cause: lastError });
    }
    await sleep(intervalMs);
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
