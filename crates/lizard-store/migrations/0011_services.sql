-- Services (`lizard up`): one row each. `name` is unique across the server (it is the
-- first label of the service's host). `body` is the JSON of its versions, instances and
-- status; `revision` moves on with every write, which names the one it read. No foreign
-- key to projects: a forced workspace delete ends a service's instances like any
-- sandbox's, and the reconciler removes services whose project is gone.
CREATE TABLE services (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL,
    workspace_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    name TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL,
    revision INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX services_account ON services (account_id);
