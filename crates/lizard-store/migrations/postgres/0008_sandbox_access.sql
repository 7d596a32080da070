-- Private sandbox URLs: a sandbox created with `publicUrls: false` answers through the
-- sandbox-URL proxy only to requests carrying its access token. Only the token's SHA-256
-- is kept. The row is written before the sandbox's own record, so a sandbox that is
-- recorded and private is never reachable without it. No foreign key for that reason.
CREATE TABLE sandbox_access (
    sandbox_id TEXT COLLATE "C" PRIMARY KEY,
    token_hash BYTEA NOT NULL
);
