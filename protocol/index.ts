/**
 * protocol/: the contract every tier shares. Tiers import from protocol/, never from each other, and
 * only through its three entry points (.dependency-cruiser.cjs enforces it, in `npm run lint`):
 * - this file, the pure contract: frames, codec, seq math, ids and subjects, the config schema,
 *   the registry model, the data layout. No sockets, no NATS, no Redis, no Node module, no process.
 * - `io/index.ts`, the shared I/O: connections, stream set-up, the registry client, the dispatcher,
 *   health and ops HTTP, signal handling, the config from the environment, flags, cursor signing.
 * - `device.ts`, the browser-safe part the device SDK is allowed.
 *
 * Each name is exported by name: this list is the public surface, about two thirds of what its
 * modules export. A module's other exports are its own; its unit tests import them from the module.
 */
export { CloseCode, closeReasons, Disconnect, ErrorCode, JetgateError, reconnectPolicy, withReason, type FatalDisconnect } from "./errors.js";
export { backoffCeiling } from "./backoff.js";
export { globalClock, sleep, systemClock, type Clock, type TimerHandle } from "./clock.js";
export { assertSeq, compareSeq, composeSeq, decodeSeq, encodeSeq, MAX_EPOCH, MAX_OFFSET, PUSH_LATENCY_BUCKETS_S, seqEpoch, seqLabel, seqOffset, SeqRangeError, U64_MAX, type MailboxSeq } from "./seq.js";
export { emptyStageCounts, observeStage, STAGE_BUCKETS_S, stageCountsOf, stageQuantileMs, STAGES, StageTimes, type StageCounts } from "./stages.js";
export { assertId, ID_PATTERN, idListSchema, idProblem, idSchema, InvalidIdError, MAX_ID_LENGTH, MAX_LANE_LENGTH, type IdKind } from "./ids.js";
export { ALL_PUSH_SUBJECTS, BROADCAST_PUSH_SUBJECT, CONTROL_SUBJECTS, entryMsgId, entrySubject, FLOORS_STREAM, FLOORS_SUBJECTS, floorSubject, frozenSubject, ingressMsgId, ingressSubject, InvalidShardError, kickSubject, OPS_STATS_SUBJECT, parseEntrySubject, REGISTRY_STREAM, REGISTRY_SUBJECT, routedPushSubject, shardStream, shardSubjects, userSubjects } from "./subjects.js";
export { MsgpackDecodeError, MsgpackWriter, pack, unpackOne } from "./msgpack.js";
export { CURSOR_SIG_BYTES, MAX_BODY_BYTES, MAX_TOKEN_LENGTH, type AckFrame, type AuthFrame, type ClientFrame, type CursorToken, type DeviceCursor, type Entry, type ErrorFrame, type PullFrame, type RefreshFrame, type SendFrame, type ServerFrame } from "./frames.js";
export { decodeClientFrame, decodeServerFrame, encodeEntry, encodeFrame, encodeLiveMsgsFrame, encodeMsgsFrame, FrameError } from "./codec.js";
export { SCOPE_ROUTES, SERVICE_SCOPES, serviceTokenHash, ServiceTokensError, ServiceTokenTable, SINGLE_TOKEN_NAME, type ServiceScope, type ServiceToken } from "./service-tokens.js";
export { tokenStrengthProblem, ConfigError, DEV_JWT_SECRET, ENV_VARS, type Config, type ConfigRole } from "./config.js";
export { countLabel, HASH_SPACE, rangeLabel, userHash } from "./hash.js";
export { applyRecord, bigintsAsStrings, bumpEpoch, claimEpoch, decodeRecord, deriveSeq, EMPTY_REGISTRY, encodeRecord, entryOwner, evenRange, halfRange, initialShards, isClaimed, planTakeover, RegistryError, registryRecord, releaseEpoch, ShardMap, splitShard, type EpochBoundary, type RegistryRecord, type RegistryState, type ShardState, type TakeoverPlan } from "./registry-model.js";
export { decodeCacheRecord, decodePushBatch, decodeStoredEntry, encodePush, encodePushBatch, encodeStoredEntry, EntryFormatError, type Push } from "./entry.js";
export { DispatchUnavailableError, DispatchValidationError, MAX_RECIPIENTS, type DispatchRequest, type DispatchResult } from "./dispatch-request.js";
export { MIN_NATS_SERVER, natsVersionProblem, parseServerVersion } from "./nats-version.js";
export { cacheStreamId, decodeFloorRecord, encodeFloorRecord, floorRecordEpochs, GATEWAY_LIVENESS, newestConsumerEpoch, HASH_FIELDS, isWorkerConsumer, parseCacheRow, parseRoutes, processingFloor, readerConsumerName, REDIS_SCRIPTS, RedisKeys, REVOCATION_FIELDS, REVOCATION_LOG_MAXLEN, REVOCATION_SWEEP_COUNT, seqKey, WATERMARK_ALL, workerConsumerEpoch, workerConsumerName, type CacheRow, type FloorRecord, type RedisScriptCommands } from "./layout.js";
