/** `Authorization: Bearer <token>` checked in constant time: how long it takes tells nothing of the token. */
export function bearerMatches(header: string, token: string): boolean {
  return constantTimeEqual(header, `Bearer ${token}`);
}

function constantTimeEqual(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  let diff = x.length ^ y.length;
  for (let i = 0; i < Math.max(x.length, y.length); i++) diff |= (x[i % Math.max(1, x.length)] ?? 0) ^ (y[i % Math.max(1, y.length)] ?? 0);
  return diff === 0;
}
