-- The first answer to a request sent with an Idempotency-Key, replayed to its retries.
-- A row without a status is a request still being served.
CREATE TABLE idempotency (
    key_id        TEXT    NOT NULL,  -- the API key that sent it (keys never share entries)
    route         TEXT    NOT NULL,  -- method and path template, e.g. "POST /v1/sandboxes"
    idem_key      TEXT    NOT NULL,  -- the client's Idempotency-Key
    request_hash  BLOB    NOT NULL,  -- SHA-256 of the path, query and body
    status        INTEGER,           -- NULL while in progress
    content_type  TEXT,
    body          BLOB,
    created_at    INTEGER NOT NULL,  -- ms since the epoch; entries expire after the retention
    PRIMARY KEY (key_id, route, idem_key)
);
CREATE INDEX idempotency_created ON idempotency (created_at);
