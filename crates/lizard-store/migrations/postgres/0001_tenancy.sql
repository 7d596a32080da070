-- Tenancy: accounts, workspaces, projects, API keys, and the sandbox records the
-- sandbox routes keep. PostgreSQL twin of ../0001_tenancy.sql: the same tables and
-- meaning; timestamps are milliseconds since the Unix epoch (BIGINT), hashes BYTEA.
-- Text is COLLATE "C" throughout: compared and ordered byte by byte as SQLite does,
-- whatever the database's locale (listings come back in the same order on both engines).

CREATE TABLE accounts (
    id         TEXT COLLATE "C" PRIMARY KEY,
    email      TEXT COLLATE "C" NOT NULL,
    plan       TEXT COLLATE "C" NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE workspaces (
    id         TEXT COLLATE "C" PRIMARY KEY,
    account_id TEXT COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    name       TEXT COLLATE "C" NOT NULL,
    slug       TEXT COLLATE "C" NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (account_id, slug),
    UNIQUE (account_id, name)
);

CREATE TABLE projects (
    id           TEXT COLLATE "C" PRIMARY KEY,
    workspace_id TEXT COLLATE "C" NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name         TEXT COLLATE "C" NOT NULL,
    slug         TEXT COLLATE "C" NOT NULL,
    created_at   BIGINT NOT NULL,
    UNIQUE (workspace_id, slug),
    UNIQUE (workspace_id, name)
);

-- Keys are stored as SHA-256 only; `prefix` (lz_ + 8) finds the row. A scoped key has
-- both `workspaces` and `projects` as JSON arrays of ids (TEXT); an unscoped one has both NULL.
CREATE TABLE api_keys (
    id         TEXT COLLATE "C" PRIMARY KEY,
    account_id TEXT COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    name       TEXT COLLATE "C" NOT NULL,
    prefix     TEXT COLLATE "C" NOT NULL,
    hash       BYTEA NOT NULL,
    workspaces TEXT COLLATE "C",
    projects   TEXT COLLATE "C",
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);
CREATE INDEX api_keys_prefix ON api_keys (prefix);
CREATE INDEX api_keys_account ON api_keys (account_id);

CREATE TABLE sandboxes (
    id         TEXT COLLATE "C" PRIMARY KEY,
    project_id TEXT COLLATE "C" NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    template   TEXT COLLATE "C" NOT NULL,
    state      TEXT COLLATE "C" NOT NULL,
    created_at BIGINT NOT NULL,
    timeout_at BIGINT,
    ended_at   BIGINT,
    end_reason TEXT COLLATE "C",
    metadata   TEXT COLLATE "C" NOT NULL DEFAULT '{}'
);
CREATE INDEX sandboxes_project ON sandboxes (project_id);
CREATE INDEX sandboxes_live_timeout ON sandboxes (timeout_at) WHERE ended_at IS NULL;
