-- Volumes: disks that outlive sandboxes. A volume lives on one node (its disk is a
-- file there), and so in that node's region; a sandbox that mounts it runs on that node.
-- A volume's name is its key inside a project. `attached_to` is the sandbox that holds
-- it (running or paused; one writer at a time), or a `creating:` reservation while a
-- sandbox boots; ending the sandbox clears it.

CREATE TABLE nodes (
    id         TEXT PRIMARY KEY,
    region     TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE TABLE volumes (
    id          TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    size_gb     INTEGER NOT NULL,
    node_id     TEXT NOT NULL REFERENCES nodes(id),
    region      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    attached_to TEXT,
    UNIQUE (project_id, name)
);
CREATE INDEX volumes_node ON volumes (node_id);
CREATE INDEX volumes_attached ON volumes (attached_to) WHERE attached_to IS NOT NULL;
