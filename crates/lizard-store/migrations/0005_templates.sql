-- Templates pushed by workspaces, their builds, and the uploaded files they are built from.
-- A template's name is its key inside a workspace; `current_build_id` is the ready build
-- new sandboxes are created from (NULL until one succeeds). Each build has its own node
-- template (`template_ref`), so a rebuild never changes what running sandboxes use.

CREATE TABLE templates (
    id               TEXT PRIMARY KEY,
    workspace_id     TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name             TEXT NOT NULL,
    description      TEXT NOT NULL DEFAULT '',
    base             TEXT NOT NULL,
    start_cmd        TEXT,
    current_build_id TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    UNIQUE (workspace_id, name)
);

-- `status` queued|running|ready|failed|cancelled; `steps` and `error` are JSON
-- (lizard_api's BuildStepInfo list and BuildFailure); `log` keeps the output's last 64 KiB;
-- `events` the build's event stream as NDJSON (bounded), for followers after it ended.
CREATE TABLE template_builds (
    id           TEXT PRIMARY KEY,
    template_id  TEXT NOT NULL REFERENCES templates(id) ON DELETE CASCADE,
    status       TEXT NOT NULL CHECK (status IN ('queued', 'running', 'ready', 'failed', 'cancelled')),
    steps        TEXT NOT NULL DEFAULT '[]',
    error        TEXT,
    log          TEXT NOT NULL DEFAULT '',
    events       TEXT NOT NULL DEFAULT '',
    template_ref TEXT NOT NULL UNIQUE,
    layer_bytes  INTEGER,
    created_at   INTEGER NOT NULL,
    finished_at  INTEGER
);
CREATE INDEX template_builds_template ON template_builds (template_id, created_at);

-- Which file contents a workspace has uploaded (the bytes live once per server in
-- `<data>/blobs/sha256/<hash>`); a workspace never learns what another uploaded.
CREATE TABLE template_blobs (
    workspace_id TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    sha256       TEXT NOT NULL,
    size         INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, sha256)
);

-- The node template a sandbox of a pushed template was created from (NULL for built-ins):
-- what keeps a build's node template alive.
ALTER TABLE sandboxes ADD COLUMN template_ref TEXT;
CREATE INDEX sandboxes_template_ref ON sandboxes (template_ref) WHERE ended_at IS NULL AND template_ref IS NOT NULL;
