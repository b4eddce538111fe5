/** Node-only helpers of the SDK (not part of the browser build). */
import { mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { dirname } from "node:path";
import type { DeviceCursor } from "../protocol/device.js";
import { deserializeCursor, serializeCursor, type CursorStore } from "./cursor-store.js";

/** A cursor in a file, replaced atomically (write a temp file, then rename). */
export class FileCursorStore implements CursorStore {
  constructor(private readonly path: string) {}

  async load(): Promise<DeviceCursor | undefined> {
    try {
      return deserializeCursor(await readFile(this.path, "utf8"));
    } catch {
      return undefined;
    }
  }

  async save(c: DeviceCursor): Promise<void> {
    await mkdir(dirname(this.path), { recursive: true });
    const tmp = `${this.path}.tmp`;
    await writeFile(tmp, serializeCursor(c));
    await rename(tmp, this.path);
  }

  async clear(): Promise<void> {
    await rm(this.path, { force: true });
  }
}
