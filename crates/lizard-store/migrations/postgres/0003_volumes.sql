-- Volumes: disks that outlive sandboxes (PostgreSQL twin of ../0003_volumes.sql). A volume
-- lives on one node (its disk is a file there), and so in that node's region; a sandbox
-- that mounts it runs on that node. A volume's name is its key inside a project.
-- `attached_to` is the sandbox that holds it (running or paused; one writer at a time), or
-- a `creating:` reservation while a sandbox boots; ending the sandbox clears it.

CREATE TABLE nodes (
    id         TEXT COLLATE "C" PRIMARY KEY,
    region     TEXT COLLATE "C" NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE volumes (
    id          TEXT COLLATE "C" PRIMARY KEY,
    project_id  TEXT COLLATE "C" NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    name        TEXT COLLATE "C" NOT NULL,
    size_gb     BIGINT NOT NULL,
    node_id     TEXT COLLATE "C" NOT NULL REFERENCES nodes(id),
    region      TEXT COLLATE "C" NOT NULL,
    created_at  BIGINT NOT NULL,
    attached_to TEXT COLLATE "C",
    UNIQUE (project_id, name)
);
CREATE INDEX volumes_node ON volumes (node_id);
CREATE INDEX volumes_attached ON volumes (attached_to) WHERE attached_to IS NOT NULL;
