-- Pushed files' content in the store (PostgreSQL twin of ../0010_blob_content.sql), so
-- that every server replica can serve any call of a push (the upload may reach one
-- replica and the build run on another). Written only by servers that share pushed files
-- (on by default with PostgreSQL).

-- A blob's content in chunks of at most 4 MiB, `seq` from 0; keyed by content, so a
-- re-upload rewrites the same bytes.
CREATE TABLE blob_chunks (
    sha256 TEXT COLLATE "C" NOT NULL,
    seq    BIGINT NOT NULL CHECK (seq >= 0),
    data   BYTEA NOT NULL,
    PRIMARY KEY (sha256, seq)
);

-- Written last, once every chunk is in and their lengths add up to `size`: a blob
-- without this row is a half-written upload and is never used.
CREATE TABLE blob_contents (
    sha256     TEXT COLLATE "C" PRIMARY KEY,
    size       BIGINT NOT NULL CHECK (size >= 0),
    chunks     BIGINT NOT NULL CHECK (chunks >= 0),
    created_at BIGINT NOT NULL
);
