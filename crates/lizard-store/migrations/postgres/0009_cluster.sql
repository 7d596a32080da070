-- Many machines (PostgreSQL twin of ../0009_cluster.sql): nodes that join over the
-- network, report and heartbeat; the node that runs each sandbox; join tokens, the
-- cluster key, and leader leases.

-- A node row: `address` is its API's base URL (NULL: the node inside the server
-- process); `state` up|draining|down; capacity and usage as of its last report;
-- `templates` the JSON array of template refs whose snapshots it holds;
-- `last_heartbeat` ms (NULL: in-process, never leased).
ALTER TABLE nodes ADD COLUMN address TEXT COLLATE "C";
ALTER TABLE nodes ADD COLUMN state TEXT COLLATE "C" NOT NULL DEFAULT 'up' CHECK (state IN ('up', 'draining', 'down'));
ALTER TABLE nodes ADD COLUMN vcpus BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN memory_mib BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN disk_gib BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN used_vcpus BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN used_memory_mib BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN sandboxes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN templates TEXT COLLATE "C" NOT NULL DEFAULT '[]';
ALTER TABLE nodes ADD COLUMN last_heartbeat BIGINT;

-- The node that runs a sandbox; every sandbox operation routes by it. NULL on rows
-- older than this migration: the in-process node (`node_local`).
ALTER TABLE sandboxes ADD COLUMN node_id TEXT COLLATE "C";
CREATE INDEX sandboxes_node_live ON sandboxes (node_id) WHERE ended_at IS NULL;

-- Join tokens (`lzn_…`), stored as SHA-256 only; reusable until they expire or are
-- revoked (one token for a fleet).
CREATE TABLE node_tokens (
    id         TEXT COLLATE "C" PRIMARY KEY,
    hash       BYTEA NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    expires_at BIGINT,
    revoked_at BIGINT
);

-- The key node credentials are derived from (HMAC-SHA256(key, node id)): one row,
-- inserted if absent by the first start, so concurrent first starts agree.
CREATE TABLE cluster_keys (
    id  TEXT COLLATE "C" PRIMARY KEY,
    key BYTEA NOT NULL
);

-- Named leader leases: the replica that holds one runs that job until `expires_at`
-- (ms) unless it renews.
CREATE TABLE leases (
    name       TEXT COLLATE "C" PRIMARY KEY,
    holder     TEXT COLLATE "C" NOT NULL,
    expires_at BIGINT NOT NULL
);

-- Sandboxes a node reported that the store has no record of, and when first seen: a
-- create in flight is recorded within seconds, so one still unknown after a grace
-- period is an orphan the node is told to stop.
CREATE TABLE node_unrecorded (
    node_id    TEXT COLLATE "C" NOT NULL,
    sandbox_id TEXT COLLATE "C" NOT NULL,
    first_seen BIGINT NOT NULL,
    PRIMARY KEY (node_id, sandbox_id)
);
