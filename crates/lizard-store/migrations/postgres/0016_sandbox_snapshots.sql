-- Sandbox snapshots: a running sandbox saved on its node (memory, processes, disk) under
-- an id of its own; sandboxes start from it later (E2B's create_snapshot). `name`: at
-- most one per project, a second snapshot under it replaces the first's save and keeps
-- its id. `node_snapshot_id`: the save's id on `node_id`.
CREATE TABLE sandbox_snapshots (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL,
    workspace_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    node_snapshot_id TEXT NOT NULL,
    source_sandbox_id TEXT NOT NULL,
    template TEXT NOT NULL,
    template_ref TEXT,
    name TEXT,
    created_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX sandbox_snapshots_by_name ON sandbox_snapshots (project_id, name);
CREATE INDEX sandbox_snapshots_by_account ON sandbox_snapshots (account_id, created_at);
