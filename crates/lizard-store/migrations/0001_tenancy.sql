-- Tenancy: accounts, workspaces, projects, API keys, and the sandbox records the
-- sandbox routes keep. Timestamps are milliseconds since the Unix epoch (INTEGER), so
-- the same schema reads the same in PostgreSQL (BIGINT).

CREATE TABLE accounts (
    id         TEXT PRIMARY KEY,
    email      TEXT NOT NULL,
    plan       TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE TABLE workspaces (
    id         TEXT PRIMARY KEY,
    account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    name       TEXT NOT NULL,
    slug       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (account_id, slug),
    UNIQUE (account_id, name)
);

CREATE TABLE projects (
    id           TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    slug         TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    UNIQUE (workspace_id, slug),
    UNIQUE (workspace_id, name)
);

-- Keys are stored as SHA-256 only; `prefix` (lz_ + 8) finds the row. A scoped key has
-- both `workspaces` and `projects` as JSON arrays of ids; an unscoped one has both NULL.
CREATE TABLE api_keys (
    id         TEXT PRIMARY KEY,
    account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    name       TEXT NOT NULL,
    prefix     TEXT NOT NULL,
    hash       BLOB NOT NULL,
    workspaces TEXT,
    projects   TEXT,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
CREATE INDEX api_keys_prefix ON api_keys (prefix);
CREATE INDEX api_keys_account ON api_keys (account_id);

CREATE TABLE sandboxes (
    id         TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    template   TEXT NOT NULL,
    state      TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    timeout_at INTEGER,
    ended_at   INTEGER,
    end_reason TEXT,
    metadata   TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX sandboxes_project ON sandboxes (project_id);
CREATE INDEX sandboxes_live_timeout ON sandboxes (timeout_at) WHERE ended_at IS NULL;
