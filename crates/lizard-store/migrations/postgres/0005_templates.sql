-- Templates pushed by workspaces, their builds, and the uploaded files they are built from
-- (PostgreSQL twin of ../0005_templates.sql). A template's name is its key inside a
-- workspace; `current_build_id` is the ready build new sandboxes are created from (NULL
-- until one succeeds). Each build has its own node template (`template_ref`), so a rebuild
-- never changes what running sandboxes use.

CREATE TABLE templates (
    id               TEXT COLLATE "C" PRIMARY KEY,
    workspace_id     TEXT COLLATE "C" NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name             TEXT COLLATE "C" NOT NULL,
    description      TEXT COLLATE "C" NOT NULL DEFAULT '',
    base             TEXT COLLATE "C" NOT NULL,
    start_cmd        TEXT COLLATE "C",
    current_build_id TEXT COLLATE "C",
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    UNIQUE (workspace_id, name)
);

-- `status` queued|running|ready|failed|cancelled; `steps` and `error` are JSON text
-- (lizard_api's BuildStepInfo list and BuildFailure); `log` keeps the output's last 64 KiB;
-- `events` the build's event stream as NDJSON (bounded), for followers after it ended.
CREATE TABLE template_builds (
    id           TEXT COLLATE "C" PRIMARY KEY,
    template_id  TEXT COLLATE "C" NOT NULL REFERENCES templates(id) ON DELETE CASCADE,
    status       TEXT COLLATE "C" NOT NULL CHECK (status IN ('queued', 'running', 'ready', 'failed', 'cancelled')),
    steps        TEXT COLLATE "C" NOT NULL DEFAULT '[]',
    error        TEXT COLLATE "C",
    log          TEXT COLLATE "C" NOT NULL DEFAULT '',
    events       TEXT COLLATE "C" NOT NULL DEFAULT '',
    template_ref TEXT COLLATE "C" NOT NULL UNIQUE,
    layer_bytes  BIGINT,
    created_at   BIGINT NOT NULL,
    finished_at  BIGINT
);
CREATE INDEX template_builds_template ON template_builds (template_id, created_at);

-- Which file contents a workspace has uploaded; a workspace never learns what another uploaded.
CREATE TABLE template_blobs (
    workspace_id TEXT COLLATE "C" NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    sha256       TEXT COLLATE "C" NOT NULL,
    size         BIGINT NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (workspace_id, sha256)
);

-- The node template a sandbox of a pushed template was created from (NULL for built-ins):
-- what keeps a build's node template alive.
ALTER TABLE sandboxes ADD COLUMN template_ref TEXT COLLATE "C";
CREATE INDEX sandboxes_template_ref ON sandboxes (template_ref) WHERE ended_at IS NULL AND template_ref IS NOT NULL;
