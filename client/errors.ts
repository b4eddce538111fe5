/** The errors the SDK throws, and rejects pending sends with. */

export class JetgateClientError extends Error {
  override readonly name: string = "JetgateClientError";
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** A send that was pending when the backend signed the user or device out (close 4403). */
export class SignedOutError extends JetgateClientError {
  override readonly name = "SignedOutError";
  constructor(reason: string) {
    super("SIGNED_OUT", `signed out: ${reason}`);
  }
}

/** A send that was pending when a newer session of this device replaced this one (close 4409). */
export class SessionReplacedError extends JetgateClientError {
  override readonly name = "SessionReplacedError";
  constructor() {
    super("REPLACED", "a newer session of this device replaced this one");
  }
}
