-- Pushed files' content in the store, so that every server replica can serve any call of
-- a push (the upload may reach one replica and the build run on another). Written only
-- by servers that share pushed files (on by default with PostgreSQL); plain SQL that
-- SQLite and PostgreSQL both take (BLOB here, BYTEA in the PostgreSQL twin).

-- A blob's content in chunks of at most 4 MiB, `seq` from 0; keyed by content, so a
-- re-upload rewrites the same bytes.
CREATE TABLE blob_chunks (
    sha256 TEXT NOT NULL,
    seq    INTEGER NOT NULL CHECK (seq >= 0),
    data   BLOB NOT NULL,
    PRIMARY KEY (sha256, seq)
);

-- Written last, once every chunk is in and their lengths add up to `size`: a blob
-- without this row is a half-written upload and is never used.
CREATE TABLE blob_contents (
    sha256     TEXT PRIMARY KEY,
    size       INTEGER NOT NULL CHECK (size >= 0),
    chunks     INTEGER NOT NULL CHECK (chunks >= 0),
    created_at INTEGER NOT NULL
);
