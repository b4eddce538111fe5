# jetgate: one image for gateway, worker and the jetgate CLI (the chart picks the command).
# Node 24 on Debian 13 (trixie, glibc 2.41): uWebSockets.js's binaries need glibc >= 2.38 and have
# no pure-JS fallback (docs/gateway.md#uwebsocketsjs), so both stages run where they load natively.

FROM node:24-trixie-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY protocol ./protocol
COPY gateway ./gateway
COPY worker ./worker
COPY client ./client
RUN npm run build && npm ci --omit=dev --no-audit --no-fund

FROM node:24-trixie-slim
ENV NODE_ENV=production JETGATE_ENV=production
WORKDIR /app
COPY --from=build --chown=root:root /app/node_modules ./node_modules
COPY --from=build --chown=root:root /app/dist ./dist
COPY --chown=root:root package.json ./
COPY --chown=root:root bin ./bin
# The files belong to root and are read-only to the process; it runs as the image's `node` user.
USER node
EXPOSE 8080 9090 9091
ENTRYPOINT ["node"]
# the gateway's V8 flags (gateway/node-flags.ts: why, and a test keeps the two the same)
CMD ["--max-semi-space-size=1", "dist/gateway/main.js"]
